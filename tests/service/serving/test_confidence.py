"""service/serving/confidence.py: the features, the manifest's calibration, the flags, and the engine's return_details
hook
on the tiny bundle."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import service.serving.engine
from service.runtime.bundle import BundleError
from service.runtime.manifest import Manifest
from service.serving.confidence import (
    FEATURES,
    Calibration,
    Evidence,
    copy_share,
    coverage,
    features,
    is_content,
)
from service.serving.engine import Engine, Filters, Options
from service.settings import Settings
from service.text.repetition import has_loop

TEXTS = ["Open file", "Delete the selected files?", "Could not open %s: permission denied"]


def entry(**over: Any) -> dict[str, Any]:
    """A calibration whose confidence is 1 + mean_logprob / 10, clipped to [0, 1]."""
    n = len(FEATURES)
    base = {
        "features": list(FEATURES),
        "mean": [0.0] * n,
        "scale": [1.0] * n,
        "weights": [1.0] + [0.0] * (n - 1),
        "bias": 0.0,
        "curve": {"x": [-10.0, 0.0], "y": [0.0, 1.0]},
        "layers": [-1],
        "omission_threshold": 0.1,
        "copy_threshold": 0.8,
    }
    return {**base, **over}


def evidence(**over: Any) -> Evidence:
    base: dict[str, Any] = {
        "token_scores": [-0.5, -1.5, -1.0],
        "coverage": [0.6, 0.5, 0.9],
        "content": [True, True, False],
        "source": "Open file",
        "output": "ファイルを開く",
    }
    return Evidence(**{**base, **over})


def test_coverage_is_the_most_attention_any_step_gave_each_source_token() -> None:
    cross = np.zeros((2, 2, 2, 3))  # (T, L, h, S)
    cross[0, 1] = [[0.8, 0.2, 0.0], [0.6, 0.4, 0.0]]  # step 0, last layer: heads average [0.7, 0.3, 0]
    cross[1, 1] = [[0.0, 0.1, 0.9], [0.2, 0.1, 0.7]]  # step 1: [0.1, 0.1, 0.8]
    cross[:, 0] = 1 / 3  # the first layer is not read
    assert coverage(cross, [-1]).tolist() == pytest.approx([0.7, 0.3, 0.8])
    assert coverage(cross, [0, 1]).tolist() == pytest.approx([(0.7 + 1 / 3) / 2, (0.3 + 1 / 3) / 2, (0.8 + 1 / 3) / 2])


def test_content_pieces_and_copy_share() -> None:
    assert is_content("▁file") and is_content("▁42")
    assert not is_content("</s>") and not is_content("▁") and not is_content("?")
    assert copy_share("Open file", "open FILE") == 1.0  # case and spaces do not count
    assert copy_share("Firefox", "Firefox を開く") == pytest.approx(7 / 10)
    assert copy_share("Open file", "ファイルを開く") == 0.0
    assert copy_share("Open file", "") == 0.0


def test_features() -> None:
    f = features(evidence(), omission_threshold=0.55)
    assert list(f) == list(FEATURES)
    assert f["mean_logprob"] == pytest.approx(-1.0) and f["min_logprob"] == -1.5
    assert f["uncovered"] == 0.5  # of the two content tokens, the one at 0.5
    assert f["mean_coverage"] == pytest.approx(0.55)
    assert f["length_ratio"] == pytest.approx(np.log(8 / 10))
    lost = features(evidence(token_scores=[float("nan")]), 0.1)  # scores not computed: read as certain
    assert lost["mean_logprob"] == lost["min_logprob"] == 0.0


def test_the_fitted_function_and_the_flags() -> None:
    c = Calibration.from_manifest(entry(), n_layers=2)
    assert c.assess(evidence()) == c.assess(evidence())
    a = c.assess(evidence())
    assert a.confidence == pytest.approx(0.9) and a.flags == []
    assert c.assess(evidence(token_scores=[-30.0])).confidence == 0.0  # clipped at the curve's ends
    assert c.assess(evidence(coverage=[0.05, 0.9, 0.9])).flags == ["omission"]
    assert c.assess(evidence(coverage=[0.9, 0.9, 0.05])).flags == []  # </s> may go unread
    assert c.assess(evidence(output="Open file")).flags == ["copy"]
    assert c.assess(evidence(source="42", output="42")).flags == []  # numbers copied are no copy-through
    strict = Calibration.from_manifest(entry(omission_threshold=0.95, copy_threshold=0.0), n_layers=2)
    assert strict.assess(evidence()).flags == ["omission", "copy"]


def test_absent_calibration_gives_no_confidence_and_default_flags() -> None:
    c = Calibration.from_manifest(None, n_layers=2)
    assert c.assess(evidence()).confidence is None
    assert c.assess(evidence(coverage=[0.01, 0.9, 0.9], output="open file")).flags == ["omission", "copy"]


@pytest.mark.parametrize(
    "bad",
    [
        {"features": ["mean_logprob"]},
        {"weights": [1.0]},
        {"scale": [0.0] * len(FEATURES)},
        {"curve": {"x": [1.0, 0.0], "y": [0.0, 1.0]}},
        {"curve": {"x": [0.0], "y": [0.0, 1.0]}},
        {"layers": [2]},
        {"layers": []},
        {"bias": "high"},
        {"curve": None},
    ],
)
def test_a_malformed_calibration_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(BundleError, match="calibration is malformed"):
        Calibration.from_manifest(entry(**bad), n_layers=2, bundle="tiny")


@pytest.fixture(scope="module")
def calibrated(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny bundle with :func:`entry` as its calibration."""
    path = Path(shutil.copytree(tiny_bundle, tmp_path_factory.mktemp("calibrated") / "bundle"))
    manifest = Manifest.read(path)
    manifest.calibration = entry()
    manifest.write(path)
    return path


def test_details_carry_confidence_flags_and_the_attention_coverage(calibrated: Path) -> None:
    engine = Engine.load(calibrated, Settings(bundles=[calibrated]))
    for text, t in zip(TEXTS, engine.translate_now(TEXTS, Options(details=True)), strict=True):
        d = t.details
        assert d is not None and len(d.coverage) == len(d.source_tokens)
        assert d.confidence == pytest.approx(min(1.0, max(0.0, 1 + np.mean(d.token_scores) / 10)), abs=1e-5)
        assert set(d.flags) <= {"omission", "copy", "repetition"}
        assert ("repetition" in d.flags) == has_loop(text, t.text)  # the random model says one letter over and over
        # The coverage is /attention's cross-attention (of the masked text, as /translate decodes it): last layer,
        # heads averaged, the most over the steps.
        (segment,) = engine.attention_now([text], Options(), Filters(kinds=["cross"]))[0].segments
        cross = segment.weights["cross"]
        assert d.coverage == pytest.approx(cross[-1].mean(axis=0).max(axis=0).tolist(), abs=1e-5)
        uncovered = any(c < 0.1 for c, p in zip(d.coverage, d.source_tokens, strict=True) if is_content(p))
        assert ("omission" in d.flags) == uncovered


def test_the_tiny_bundle_without_calibration_gives_null_confidence(tiny_bundle: Path) -> None:
    engine = Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle]))
    (t,) = engine.translate_now(TEXTS[:1], Options(details=True))
    assert t.details is not None and t.details.confidence is None and len(t.details.coverage) > 0


def test_requests_without_details_compute_nothing(calibrated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine.load(calibrated, Settings(bundles=[calibrated]))

    def fail(*_: object) -> None:
        raise AssertionError("assessed a text that did not ask for details")

    monkeypatch.setattr(Calibration, "assess", fail)
    monkeypatch.setattr(service.serving.engine, "coverage", fail)
    assert all(t.details is None for t in engine.translate_now(TEXTS, Options()))


def test_a_malformed_calibration_stops_the_bundle_loading(tiny_bundle: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = Manifest.read(path)
    manifest.calibration = entry(layers=[5])
    manifest.write(path)
    with pytest.raises(BundleError, match="layers"):
        Engine.load(path, Settings(bundles=[path]))
