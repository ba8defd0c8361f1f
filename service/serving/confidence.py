"""How sure a translation is: ``return_details``' ``confidence`` and ``flags``, from the decoder's token scores and
the cross-attention's coverage of the source.

The confidence is a function fitted on the dev split (``attnserve calibrate``, model/calibrate.py) and stored in the
bundle's manifest (``calibration``): a linear score of the features below, standardized, mapped through an isotonic
(monotone) curve onto the sentence chrF / 100 the dev texts got against their references. This module evaluates
it with numpy only; a bundle without ``calibration`` gives ``confidence`` None and flags by the default thresholds.

Flags:
    ``omission``: a content source token (one with a letter or digit) that no decoding step gave at least
        ``omission_threshold`` of its attention (heads averaged over the calibration's ``layers``).
    ``copy``: at least ``copy_threshold`` of the output's characters repeat the source (case folded, spaces
        ignored): the text came through untranslated.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from service.runtime.bundle import BundleError

FEATURES = ("mean_logprob", "min_logprob", "uncovered", "mean_coverage", "copy_share", "length_ratio")
OMISSION_THRESHOLD = 0.1  # without a calibration: a content token no step gave a tenth of its attention
COPY_THRESHOLD = 0.8


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one text's assessment reads: its decoding's token log-probabilities, each source token's coverage
    (the most attention any step gave it), which source tokens carry content, and the two texts."""

    token_scores: Sequence[float]
    coverage: Sequence[float]
    content: Sequence[bool]
    source: str
    output: str


@dataclass(frozen=True, slots=True)
class Assessment:
    """A translation's confidence in [0, 1] (None without a calibration) and its flags."""

    confidence: float | None
    flags: list[str]


def coverage(cross: npt.NDArray[np.floating[Any]], layers: Sequence[int]) -> npt.NDArray[np.float64]:
    """Each source token's coverage: the most attention any decoding step gave it.

    Args:
        cross: the steps' cross-attention, (T, L, h, S).
        layers: decoder layers whose heads are averaged (negative indices count from the last).
    Returns:
        (S,) values in [0, 1].
    """
    rows = cross[:, list(layers)].mean(axis=(1, 2))  # (T, S)
    return np.asarray(rows.max(axis=0), np.float64)


def is_content(piece: str) -> bool:
    """Whether a source piece carries a word (a letter or a digit): punctuation, spaces and </s> may go unread."""
    return piece != "</s>" and any(c.isalnum() for c in piece)


def copy_share(source: str, output: str) -> float:
    """The share of the output's characters (case folded, spaces dropped) inside blocks it shares with the source
    (difflib's longest matching blocks); 0 for an empty output."""
    a = "".join(source.casefold().split())
    b = "".join(output.casefold().split())
    if not b:
        return 0.0
    blocks = difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks()
    return sum(m.size for m in blocks) / len(b)


def features(e: Evidence, omission_threshold: float) -> dict[str, float]:
    """The calibration's inputs for one text (:data:`FEATURES`, in that order)."""
    scores = [s for s in e.token_scores if math.isfinite(s)] or [0.0]
    covered = [c for c, keep in zip(e.coverage, e.content, strict=True) if keep] or [1.0]
    return {
        "mean_logprob": float(np.mean(scores)),
        "min_logprob": float(min(scores)),
        "uncovered": sum(c < omission_threshold for c in covered) / len(covered),
        "mean_coverage": float(np.mean(covered)),
        "copy_share": copy_share(e.source, e.output),
        "length_ratio": math.log((len(e.output) + 1) / (len(e.source) + 1)),
    }


@dataclass(frozen=True)
class Calibration:
    """The manifest's ``calibration``: the fitted function and the flags' thresholds (docs/ARCHITECTURE.md)."""

    layers: tuple[int, ...] = (-1,)
    omission_threshold: float = OMISSION_THRESHOLD
    copy_threshold: float = COPY_THRESHOLD
    mean: npt.NDArray[np.float64] | None = None  # None: no fitted confidence
    scale: npt.NDArray[np.float64] | None = None
    weights: npt.NDArray[np.float64] | None = None
    bias: float = 0.0
    curve_x: npt.NDArray[np.float64] | None = None  # the isotonic curve: linear score -> chrF / 100
    curve_y: npt.NDArray[np.float64] | None = None

    @classmethod
    def from_manifest(cls, entry: Any, n_layers: int, bundle: str = "") -> Calibration:
        """Read the manifest's ``calibration`` (absent: the defaults, with no confidence); ``n_layers`` is the
        model's decoder layers, which ``layers`` must index.

        Raises:
            BundleError: the field is there but malformed.
        """
        if entry is None:
            return cls()
        try:
            if list(entry["features"]) != list(FEATURES):
                raise ValueError(f"features {entry['features']} are not {list(FEATURES)}")
            arrays = {k: np.asarray(entry[k], np.float64) for k in ("mean", "scale", "weights")}
            curve = {k: np.asarray(entry["curve"][k], np.float64) for k in ("x", "y")}
            if any(a.shape != (len(FEATURES),) for a in arrays.values()) or curve["x"].shape != curve["y"].shape:
                raise ValueError("mean, scale and weights need one value a feature, curve x and y the same length")
            if curve["x"].size == 0 or np.any(np.diff(curve["x"]) < 0) or np.any(arrays["scale"] <= 0):
                raise ValueError("the curve needs increasing x, and every scale must be positive")
            layers = tuple(int(i) for i in entry["layers"])
            if not layers or any(not -n_layers <= i < n_layers for i in layers):
                raise ValueError(f"layers {list(layers)} are not decoder layers 0..{n_layers - 1}")
            return cls(
                layers=layers,
                omission_threshold=float(entry["omission_threshold"]),
                copy_threshold=float(entry["copy_threshold"]),
                bias=float(entry["bias"]),
                curve_x=curve["x"],
                curve_y=np.clip(curve["y"], 0.0, 1.0),
                **arrays,
            )
        except (KeyError, TypeError, ValueError) as e:
            message = f"bundle {bundle}: calibration is malformed ({e}): run `attnserve calibrate` again"
            raise BundleError(message) from e

    def linear(self, values: dict[str, float]) -> float:
        """The fitted linear score of a text's features (before the isotonic curve)."""
        assert self.mean is not None and self.scale is not None and self.weights is not None
        x = (np.array([values[f] for f in FEATURES]) - self.mean) / self.scale
        return float(x @ self.weights + self.bias)

    def assess(self, e: Evidence) -> Assessment:
        """One text's confidence (six decimals) and flags."""
        values = features(e, self.omission_threshold)
        flags = []
        if values["uncovered"] > 0:
            flags.append("omission")
        if values["copy_share"] >= self.copy_threshold and any(c.isalpha() for c in e.output):
            flags.append("copy")
        confidence = None
        if self.curve_x is not None and self.curve_y is not None:
            confidence = round(float(np.interp(self.linear(values), self.curve_x, self.curve_y)), 6)
        return Assessment(confidence, flags)
