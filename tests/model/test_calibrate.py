"""attnserve calibrate: the omission threshold, the fit, and the manifest field, on hand-made rows and the tiny
bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from model.calibrate import Scored, calibrate, fit, omission_threshold
from model.cli import main
from service.runtime.manifest import Manifest
from service.serving.confidence import Calibration
from service.serving.engine import Details, Engine, Options, Translation
from service.settings import Settings


def row(mean_logprob: float, chrf: float, cover: float = 0.5, output: str = "ファイルを開く") -> Scored:
    details = Details(
        source_tokens=["▁Open", "▁file", "</s>"],
        tokens=["▁", "x", "</s>"],
        score=3 * mean_logprob,
        token_scores=[mean_logprob] * 3,
        alignment=[0, 1, 2],
        coverage=[0.9, cover, 0.0],
    )
    return Scored("Open file", "ファイルを開く", Translation(output, [], details), chrf)


def test_the_omission_threshold_separates_incomplete_translations() -> None:
    rows = [row(-0.5, 0.9, cover=0.3) for _ in range(5)] + [row(-2.0, 0.1, 0.07, output="フ") for _ in range(5)]
    assert [r.incomplete for r in rows] == [False] * 5 + [True] * 5
    tau, j = omission_threshold(rows)
    assert 0.07 < tau <= 0.3 and j == 1.0


def test_the_fit_is_monotone_and_in_range() -> None:
    rng = np.random.default_rng(0)
    lp = rng.uniform(-3, 0, 200)
    rows = [row(float(x), float(np.clip(1 + x / 3 + rng.normal(0, 0.05), 0, 1))) for x in lp]
    entry = fit(rows, [-1], 0.1)
    c = Calibration.from_manifest(entry, n_layers=2)
    conf = [c.assess(r.evidence).confidence for r in sorted(rows, key=lambda r: r.chrf)]
    assert all(x is not None and 0 <= x <= 1 for x in conf)
    assert np.corrcoef(np.array(conf, float), sorted(r.chrf for r in rows))[0, 1] > 0.9
    assert abs(np.mean(conf) - np.mean([r.chrf for r in rows])) < 0.01  # isotonic: calibrated on its own data


def test_calibrate_writes_only_its_field(tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = tmp_path / "en-ja"
    corpus.mkdir()
    pairs = ["Open file\tファイルを開く", "Settings\t設定", "Close window\tウィンドウを閉じる", "Save as\t保存"]
    (corpus / "dev.tsv").write_text("".join(f"{p}\tpkg\n" for p in pairs * 5))
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    before = Manifest.read(bundle).data
    assert main(["calibrate", str(bundle), "--corpus", str(corpus), "--dry-run"]) == 0
    assert Manifest.read(bundle).data == before
    assert json.loads(capsys.readouterr().out)["dev_set"] == "en-ja dev split (20 pairs)"
    entry = calibrate(bundle, corpus, layers=[0, 1])
    after = Manifest.read(bundle).data
    assert after.pop("calibration") == entry and after == before
    assert entry["layers"] == [0, 1] and entry["command"].startswith("attnserve calibrate")
    engine = Engine.load(bundle, Settings(bundles=[bundle]))
    (t,) = engine.translate_now(["Open file"], Options(details=True))
    assert t.details is not None and t.details.confidence is not None and 0 <= t.details.confidence <= 1
