"""Settings: the bundles served by default and a directory of bundles in ATTNSERVE_BUNDLES."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.settings import MODEL_BUNDLES, Settings


def test_default_serves_every_shipped_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNSERVE_BUNDLES", raising=False)
    shipped = sorted(p.parent for p in MODEL_BUNDLES.glob("*/manifest.json"))
    assert shipped and Settings().bundles == shipped


def test_bundles_setting_expands_a_directory_of_bundles(
    tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("en-ja", "en-de"):
        shutil.copytree(tiny_bundle, tmp_path / "bundles" / name)
    monkeypatch.setenv("ATTNSERVE_BUNDLES", f"{tmp_path / 'bundles'},{tiny_bundle}")
    assert Settings().bundles == [tmp_path / "bundles" / "en-de", tmp_path / "bundles" / "en-ja", tiny_bundle]
