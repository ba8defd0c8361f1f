"""Bundles are verified at load: a missing or altered file is a clear error, never a half-loaded model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.bundle import BundleError, load_bundle


@pytest.fixture
def bundle_copy(tiny_bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))


def test_a_good_bundle_loads(bundle_copy: Path) -> None:
    bundle = load_bundle(bundle_copy)
    assert (bundle.name, bundle.source_lang, bundle.target_lang) == ("tiny-en-ja", "en", "ja")
    assert bundle.tokenizer.decode(bundle.tokenizer.encode_target("設定")) == "設定"


def test_altered_file_fails_the_checksum(bundle_copy: Path) -> None:
    with (bundle_copy / "decoder.onnx").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match=r"decoder\.onnx: sha256 does not match"):
        load_bundle(bundle_copy)


def test_missing_file_and_missing_manifest(bundle_copy: Path, tmp_path: Path) -> None:
    (bundle_copy / "spm.model").unlink()
    with pytest.raises(BundleError, match=r"spm\.model is missing"):
        load_bundle(bundle_copy)
    with pytest.raises(BundleError, match=r"no manifest\.json"):
        load_bundle(tmp_path)


def test_unknown_format(bundle_copy: Path) -> None:
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    (bundle_copy / "manifest.json").write_text(json.dumps({**manifest, "format": "other/9"}))
    with pytest.raises(BundleError, match="format 'other/9'"):
        load_bundle(bundle_copy)
