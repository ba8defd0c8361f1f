"""Settings: the bundles served by default and a directory of bundles in ATTNSERVE_BUNDLES."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.settings import MODEL_BUNDLES, Settings


def test_default_serves_every_shipped_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNSERVE_BUNDLES", raising=False)
    shipped = sorted(p.parent for p in MODEL_BUNDLES.glob("*/manifest.json"))
    assert shipped and Settings().bundle_paths() == shipped


def test_bundles_setting_expands_a_directory_of_bundles(
    tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("en-ja", "en-de"):
        shutil.copytree(tiny_bundle, tmp_path / "bundles" / name)
    monkeypatch.setenv("ATTNSERVE_BUNDLES", f"{tmp_path / 'bundles'},{tiny_bundle}")
    assert Settings().bundle_paths() == [tmp_path / "bundles" / "en-de", tmp_path / "bundles" / "en-ja", tiny_bundle]


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"ATTNSERVE_DEFAULT_BEAM_SIZE": "9"}, "less than or equal to 8"),
        ({"ATTNSERVE_DEFAULT_BEAM_SIZE": "6", "ATTNSERVE_MAX_BEAM_SIZE": "4"}, "default_beam_size=6 is over"),
        ({"ATTNSERVE_DEFAULT_LENGTH_PENALTY": "-1"}, "greater than or equal to 0"),
        ({"ATTNSERVE_PAIR_DEFAULTS": '{"en-de": {"beam": 4}}'}, "Extra inputs are not permitted"),
        ({"ATTNSERVE_PAIR_DEFAULTS": '{"en-de": {"length_penalty": "short"}}'}, "valid number"),
        ({"ATTNSERVE_PAIR_DEFAULTS": "en-de=4"}, '"pair_defaults"'),
    ],
)
def test_a_bad_decoding_default_is_one_line_naming_it(
    env: dict[str, str], needle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.serving.startup import StartupError, load_settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StartupError) as e:
        load_settings({})
    assert "\n" not in str(e.value) and needle in str(e.value)
