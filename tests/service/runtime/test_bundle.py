"""Bundles are verified at load: a missing or altered file is a clear error, never a half-loaded model."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from service.runtime.bundle import BundleError, GraphForm, load_bundle
from service.runtime.manifest import Manifest


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


def edit_manifest(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = Manifest.read(bundle)
    change(manifest.data)
    manifest.write(bundle)


def test_unknown_format(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, lambda m: m.update(format="other/9"))
    with pytest.raises(BundleError, match="format 'other/9'"):
        load_bundle(bundle_copy)


def test_graph_forms_are_read_into_typed_forms(bundle_copy: Path) -> None:
    bundle = load_bundle(bundle_copy)
    assert bundle.form("encoder") == GraphForm("encoder", attentions=True)
    assert bundle.form("decoder") == GraphForm("decoder", attentions=True, cache="appended")
    fast = GraphForm("decoder", attentions=False, cache="in_place", grouped_cross=True, greedy_tokens=True)
    assert bundle.form("fast_decoder") == fast
    assert bundle.has_graph("forced_decoder") and not bundle.has_graph("int8")
    assert bundle.form("forced_decoder") == GraphForm("forced", attentions=True)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda m: m.pop("graph_forms"), r"manifest\.json: no graph_forms object"),
        (lambda m: m["graph_forms"].pop("decoder.fast.onnx"), r"graph_forms\['decoder\.fast\.onnx'\] is missing"),
        (lambda m: m["graph_forms"]["decoder.onnx"].update(cache="rolling"), r"\['decoder\.onnx'\]: cache 'rolling'"),
        (lambda m: m["graph_forms"]["encoder.onnx"].update(attentions=1), r"\['encoder\.onnx'\]: attentions 1"),
        (lambda m: m["graph_forms"]["encoder.onnx"].update(cache="appended"), r"\['encoder\.onnx'\]: keys"),
        (lambda m: m["graph_forms"]["decoder.onnx"].pop("greedy_tokens"), r"\['decoder\.onnx'\]: keys"),
        (lambda m: m["graph_forms"].update({"decoder.onnx": "appended"}), r"\['decoder\.onnx'\]: expected an object"),
        (lambda m: m["graph_forms"]["encoder.onnx"].update(role="decoder"), r"\['encoder\.onnx'\]: keys"),
        (lambda m: m["graph_forms"].update({"decoder.onnx": {"role": "encoder", "attentions": True}}),
         r"\['decoder\.onnx'\]: role 'encoder', but graphs names it as the decoder"),
        (lambda m: m["graph_forms"]["decoder.onnx"].update(role="step"), r"\['decoder\.onnx'\]: role 'step'"),
        (lambda m: m["graph_forms"]["decoder.forced.onnx"].update(attentions=False),
         r"\['decoder\.forced\.onnx'\]: a forced decoder gives cross-attention"),
        (lambda m: m["graph_forms"]["decoder.forced.onnx"].update(cache="appended"),
         r"\['decoder\.forced\.onnx'\]: keys"),
        (lambda m: m["graph_forms"].update({"decoder.onnx": {"role": "forced", "attentions": True}}),
         r"\['decoder\.onnx'\]: role 'forced', but graphs names it as the decoder"),
        (lambda m: m["graph_forms"]["decoder.forced.onnx"].update(role="decoder"),
         r"\['decoder\.forced\.onnx'\]: keys"),
    ],
)  # fmt: skip
def test_missing_or_mangled_graph_forms_fail_naming_the_entry(
    bundle_copy: Path, change: Callable[[dict[str, Any]], None], error: str
) -> None:
    edit_manifest(bundle_copy, change)
    with pytest.raises(BundleError, match=error):
        load_bundle(bundle_copy)


def test_a_directory_of_bundles_stands_for_each_bundle_in_name_order(tiny_bundle: Path, tmp_path: Path) -> None:
    from service.runtime.bundle import bundle_dirs

    for name in ("b-pair", "a-pair"):
        shutil.copytree(tiny_bundle, tmp_path / "many" / name)
    (tmp_path / "many" / "notes").mkdir()  # not a bundle: left out
    (tmp_path / "empty").mkdir()
    many, empty, missing = tmp_path / "many", tmp_path / "empty", tmp_path / "missing"
    assert bundle_dirs([tiny_bundle, many]) == [tiny_bundle, many / "a-pair", many / "b-pair"]
    assert bundle_dirs([empty, missing]) == [empty, missing], "kept as they are, for loading to name"
