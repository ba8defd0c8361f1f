"""What a set of bundles serves, read from manifests alone: the bundle an in-process command picks."""

from __future__ import annotations

from pathlib import Path

from service.serving.catalog import bundle_for
from tests.service.pair_bundles import pair_bundle


def test_bundle_for_picks_the_first_serving_the_pair(tiny_bundle: Path, tmp_path: Path) -> None:
    de, ja = (pair_bundle(tiny_bundle, tmp_path, "en", t) for t in ("de", "ja"))
    fr_de = pair_bundle(tiny_bundle, tmp_path, "fr", "de")
    assert bundle_for([de, ja], target="ja") == ja
    assert bundle_for([de, fr_de], "fr", "de") == fr_de
    assert bundle_for([ja, de]) == ja, "no language asked: the first"


def test_bundle_for_falls_back_to_the_first_for_loading_to_report(tiny_bundle: Path, tmp_path: Path) -> None:
    ja = pair_bundle(tiny_bundle, tmp_path, "en", "ja")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    assert bundle_for([broken, tmp_path / "missing", ja], target="ja") == ja
    assert bundle_for([broken, ja], target="ko") == broken
