"""Evaluation plumbing on a tiny bundle and a hand-made corpus (no real model, no download)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from model.evaluate import evaluate, scores, translation_memory
from model.export.quantize import add_int8
from service.runtime.manifest import Manifest


def test_translation_memory_takes_the_closest_training_source() -> None:
    train = [("Open file", "ファイルを開く"), ("Close window", "ウィンドウを閉じる"), ("Settings", "設定")]
    assert translation_memory(train, ["Open the file", "Close windows"]) == ["ファイルを開く", "ウィンドウを閉じる"]


def test_scores_are_sacrebleus() -> None:
    assert scores(["ファイルを開く"], ["ファイルを開く"]) == {"chrF": 100.0, "BLEU": 100.0}
    assert scores(["xyz"], ["設定"])["chrF"] == 0.0
    # German BLEU counts words: one word of four wrong is far from a character-level near miss
    assert (
        scores(["Die Datei existiert bereits"], ["Die Datei existiert schon"], "de")["BLEU"]
        < scores(["Die Datei existiert bereits"], ["Die Datei existiert schon"], "ja")["BLEU"]
    )


def test_evaluate_writes_scores_into_the_manifest(tiny_bundle: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "en-ja"
    corpus.mkdir()
    (corpus / "train.tsv").write_text("Open file\tファイルを開く\tpkg\nSettings\t設定\tpkg\n")
    (corpus / "test.tsv").write_text("Open the file\tファイルを開く\tpkg\nSettings\t設定\tpkg\n")
    bundle = shutil.copytree(tiny_bundle, tmp_path / "bundle")
    add_int8(bundle)
    report = evaluate(bundle, corpus, write=True)
    assert report["results"]["translation memory"]["chrF"] == 100.0
    assert len(report["samples"]) == 20
    recorded = Manifest.read(bundle).scores
    decodings = {"greedy", "beam 4", "greedy, int8", "beam 4, int8", "translation memory"}
    assert {(s["decoding"], s["metric"]) for s in recorded} == {(d, m) for d in decodings for m in ("chrF", "BLEU")}
    assert all(s["command"].startswith("attnserve evaluate") for s in recorded)


def test_only_test_scores_go_into_the_manifest(tiny_bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="test-split"):
        evaluate(tiny_bundle, tmp_path, write=True, split="dev")
