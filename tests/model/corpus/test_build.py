"""Tests of model/corpus/build.py: a build from tiny .debs."""

from __future__ import annotations

import json
from pathlib import Path

from model.corpus.build import build
from model.data import read_tsv
from tests.model.corpus.debs import needs_dpkg


@needs_dpkg
def test_build_writes_deterministic_splits(debs: Path, tmp_path: Path) -> None:
    summary = build("en-ja", debs, tmp_path / "a")
    build("en-ja", debs, tmp_path / "b", command=summary["command"])
    for name in ("train.tsv", "dev.tsv", "test.tsv", "dropped.tsv", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name

    rows = [row for split in ("train", "dev", "test") for row in read_tsv(tmp_path / "a" / f"{split}.tsv")]
    assert sorted(rows) == [
        ("Add books", "本を追加", "calibre"),
        ("Close window", "ウィンドウを閉じる", "gnome-foo"),
        ("Insert Table", "表の挿入", "calibre"),
        ("Open", "開く", "gnome-foo"),
        ("Quit", "終了", "calibre,gnome-foo"),
    ]
    for split in ("train", "dev", "test"):
        for line in (tmp_path / "a" / f"{split}.tsv").read_text(encoding="utf-8").splitlines():
            assert line.count("\t") == 2
    assert summary["dropped"]["credits"] == 1 and summary["dropped"]["same"] == 1
    assert summary["packages"]["gnome-foo"] == {"pairs": 3, "license": "GPL-2+", "licenses": ["GPL-2+"]}
    assert summary["packages"]["calibre"]["license"] == "see gnome-foo"
    assert summary["debs"] == ["calibre_1.0-1_all.deb", "gnome-foo_1.0-1_all.deb"]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["total_pairs"] == 5

    german = build("en-de", debs, tmp_path / "de")
    assert german["total_pairs"] == 2  # "_Open" → "Ö_ffnen" becomes Open → Öffnen; "Add books"
