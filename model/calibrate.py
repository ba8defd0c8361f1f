"""Fit ``return_details``' confidence on the dev split and write it into the bundle's manifest (``calibration``).

The dev texts are translated through the service's own engine with ``return_details`` (greedy, the default
decoding), so the features are the ones the service computes (service/serving/confidence.py). Then:

1. the omission threshold: the coverage below which a content source token counts as unread, chosen where the
   omission flag best separates incomplete translations from the others (Youden's J, true minus false positive
   rate); a translation is *incomplete* when its characters (spaces dropped) are fewer than
   :data:`INCOMPLETE_RATIO` of the reference's;
2. the confidence: scikit-learn's ridge regression of the sentence chrF / 100 on the standardized features, then an
   isotonic regression of chrF / 100 on that linear score (monotone, in [0, 1]), which calibrates it.

    attnserve calibrate model/bundles/en-ja --corpus ~/.cache/attnserve/corpus/en-ja
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler
from tqdm import tqdm

from model.data import read_pairs
from service.runtime.manifest import MANIFEST, Manifest
from service.serving.confidence import COPY_THRESHOLD, FEATURES, Calibration, Evidence, features, is_content
from service.serving.engine import Engine, Options, Translation
from service.settings import Settings

log = logging.getLogger(__name__)

INCOMPLETE_RATIO = 0.6  # output shorter than this share of the reference's characters: something is missing
THRESHOLDS = tuple(round(x, 3) for x in np.arange(0.02, 0.52, 0.02))  # the omission thresholds tried


@dataclass(frozen=True)
class Scored:
    """One dev or test text: its source, reference, translation (with details) and sentence chrF / 100."""

    source: str
    reference: str
    translation: Translation
    chrf: float

    @property
    def evidence(self) -> Evidence:
        d = self.translation.details
        assert d is not None
        content = [is_content(p) for p in d.source_tokens]
        return Evidence(d.token_scores, d.coverage, content, self.source, self.translation.text)

    @property
    def incomplete(self) -> bool:
        """Whether the reference shows the translation to be incomplete (much shorter in characters)."""
        return chars(self.translation.text) < INCOMPLETE_RATIO * chars(self.reference)


def chars(text: str) -> int:
    return len("".join(text.split()))


def translate_scored(
    bundle_dir: Path, pairs: list[tuple[str, str]], layers: list[int] | None = None, batch_size: int = 32
) -> list[Scored]:
    """Translate ``pairs``' sources with details through the engine (sorted by length to cut padding) and score
    each against its reference (sacrebleu's sentence chrF).

    Args:
        bundle_dir: the bundle.
        pairs: (source, reference) pairs.
        layers: the coverage's decoder layers, with no fitted confidence (fitting); None: the manifest's
            calibration as the service reads it (measuring).
        batch_size: texts decoded together.
    """
    engine = Engine.load(bundle_dir, Settings(bundles=[bundle_dir], threads=0, max_texts=batch_size))
    if layers is not None:
        engine.calibration = Calibration(layers=tuple(layers))
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
    out: list[Scored | None] = [None] * len(pairs)
    for start in tqdm(range(0, len(order), batch_size), desc="details", unit="batch", leave=False):
        idx = order[start : start + batch_size]
        translations = engine.translate_now([pairs[i][0] for i in idx], Options(details=True))
        for i, t in zip(idx, translations, strict=True):
            source, reference = pairs[i]
            chrf = sacrebleu.sentence_chrf(t.text, [reference]).score / 100
            out[i] = Scored(source, reference, t, chrf)
    return [s for s in out if s is not None and s.translation.details is not None]


def omission_threshold(rows: list[Scored]) -> tuple[float, float]:
    """The threshold of :data:`THRESHOLDS` with the best Youden's J against ``incomplete``, and that J."""
    incomplete = np.array([r.incomplete for r in rows])
    evidence = [r.evidence for r in rows]
    best = (THRESHOLDS[0], -1.0)
    for tau in THRESHOLDS:
        fired = np.array([features(e, tau)["uncovered"] > 0 for e in evidence])
        tpr = fired[incomplete].mean() if incomplete.any() else 0.0
        fpr = fired[~incomplete].mean() if (~incomplete).any() else 0.0
        if (j := float(tpr - fpr)) > best[1]:
            best = (tau, j)
    return best


def fit(rows: list[Scored], layers: list[int], tau: float) -> dict[str, Any]:
    """The manifest's ``calibration`` for ``rows`` (dev), with ``tau`` as the omission threshold."""
    x = np.array([[features(r.evidence, tau)[f] for f in FEATURES] for r in rows])
    y = np.array([r.chrf for r in rows])
    scaler = StandardScaler().fit(x)
    ridge = Ridge(alpha=1.0).fit(scaler.transform(x), y)
    linear = ridge.predict(scaler.transform(x))
    curve = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(linear, y)
    return {
        "features": list(FEATURES),
        "mean": [round(float(v), 6) for v in scaler.mean_],
        "scale": [round(float(v), 6) for v in scaler.scale_],
        "weights": [round(float(v), 6) for v in ridge.coef_],
        "bias": round(float(ridge.intercept_), 6),
        "curve": {
            "x": [round(float(v), 6) for v in curve.X_thresholds_],
            "y": [round(float(v), 6) for v in curve.y_thresholds_],
        },
        "layers": layers,
        "omission_threshold": tau,
        "copy_threshold": COPY_THRESHOLD,
    }


def calibrate(
    bundle_dir: Path, corpus: Path, *, layers: list[int] | None = None, limit: int | None = None, write: bool = True
) -> dict[str, Any]:
    """Fit the calibration on ``corpus``' dev split; with ``write``, store it in the bundle's manifest.

    Args:
        bundle_dir: the bundle.
        corpus: a corpus directory with dev.tsv.
        layers: decoder layers whose heads' cross-attention gives the coverage (default: the last).
        limit: the first N dev pairs only.
        write: record the result as the manifest's ``calibration``.
    """
    layers = layers or [-1]
    manifest = Manifest.read(bundle_dir)
    rows = translate_scored(bundle_dir, read_pairs(corpus / "dev.tsv")[:limit], layers)
    tau, j = omission_threshold(rows)
    calibration = fit(rows, layers, tau)
    command = f"attnserve calibrate {bundle_dir} --corpus {corpus}" + (f" --limit {limit}" if limit else "")
    calibration["dev_set"] = f"{corpus.name} dev split ({len(rows)} pairs)"
    calibration["command"] = command
    log.info(
        "omission threshold %.3f (Youden's J %.3f on dev), %d curve points", tau, j, len(calibration["curve"]["x"])
    )
    if write:
        manifest.calibration = calibration
        manifest.write(bundle_dir)
        log.info("wrote the calibration into %s", bundle_dir / MANIFEST)
    return calibration
