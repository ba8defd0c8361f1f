"""service/runtime/manifest.py: manifest.json read and written back to the byte, every field kept, and the typed
fields that model/, service/ and bench/ read and change."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.runtime.manifest import MANIFEST, Manifest, ManifestError, is_bundle, sha256
from service.settings import MODEL_BUNDLES
from tests.conftest import FIXTURES, TINY, TINY_INT8

# exported, trained and shipped (scores, calibration and derived written after the export), and the tests' own
REAL = [MODEL_BUNDLES / "en-ja", MODEL_BUNDLES / "en-de", FIXTURES / TINY, FIXTURES / TINY_INT8]


@pytest.mark.parametrize("bundle", REAL, ids=lambda p: p.name)
def test_a_real_manifest_is_written_back_to_the_byte(bundle: Path, tmp_path: Path) -> None:
    Manifest.read(bundle).write(tmp_path)
    assert (tmp_path / MANIFEST).read_bytes() == (bundle / MANIFEST).read_bytes()


@pytest.mark.parametrize("bundle", [MODEL_BUNDLES / "en-ja", FIXTURES / TINY_INT8], ids=lambda p: p.name)
def test_checksums_written_again_over_the_same_files_are_the_same_bytes(bundle: Path, tmp_path: Path) -> None:
    """Every file hashed again, in its place among the fields; a derived graph not written yet keeps its sha256."""
    copy = Path(shutil.copytree(bundle, tmp_path / "bundle", ignore=shutil.ignore_patterns("*.int8.onnx")))
    manifest = Manifest.read(copy)
    assert set(manifest.derived) - {p.name for p in copy.iterdir()} == set(manifest.derived) != set()
    manifest.write_with_checksums(copy)
    assert (copy / MANIFEST).read_bytes() == (bundle / MANIFEST).read_bytes()


def test_the_file_is_indented_utf8_with_a_final_newline(tmp_path: Path) -> None:
    Manifest({"name": "日本語", "b": 1, "a": [1]}).write(tmp_path)
    written = (tmp_path / MANIFEST).read_text(encoding="utf-8")
    assert written == '{\n  "name": "日本語",\n  "b": 1,\n  "a": [\n    1\n  ]\n}\n'


def test_unknown_fields_and_their_order_round_trip(tmp_path: Path) -> None:
    data = {"zeta": {"nested": [1, None]}, **Manifest.read(FIXTURES / TINY).data, "alpha": "future field"}
    Manifest(data).write(tmp_path)
    read = Manifest.read(tmp_path)
    assert list(read.data) == list(data) and read.data == data


def test_checksums_cover_every_other_file(tmp_path: Path) -> None:
    (tmp_path / "b.onnx").write_bytes(b"graph")
    (tmp_path / "a.bin").write_bytes(b"weights")
    manifest = Manifest({"name": "x", "sha256": {"gone.onnx": "0" * 64}, "provenance": {}})
    manifest.write_with_checksums(tmp_path)
    read = Manifest.read(tmp_path)
    assert list(read.data) == ["name", "sha256", "provenance"]  # a field set again keeps its place
    assert read.sha256 == {"a.bin": sha256(tmp_path / "a.bin"), "b.onnx": sha256(tmp_path / "b.onnx")}


def test_language_fields_are_set_in_place(tmp_path: Path) -> None:
    manifest = Manifest.read(FIXTURES / TINY)
    order = list(manifest.data)
    manifest.name, manifest.source_lang, manifest.target_lang = "tiny-de-fr", "de", "fr"
    manifest.write(tmp_path)
    read = Manifest.read(tmp_path)
    assert (read.name, read.source_lang, read.target_lang) == ("tiny-de-fr", "de", "fr")
    assert list(read.data) == order


def test_scores_and_calibration(tmp_path: Path) -> None:
    manifest = Manifest({"name": "x"})
    assert manifest.scores == [] and manifest.calibration is None
    score = {"metric": "chrF", "value": 50.0, "decoding": "greedy", "test_set": "t", "command": "c"}
    manifest.scores, manifest.calibration = [score], {"layers": [-1]}
    manifest.write(tmp_path)
    read = Manifest.read(tmp_path)
    assert read.scores == [score] and read.calibration == {"layers": [-1]}
    assert Manifest.read(MODEL_BUNDLES / "en-ja").scores  # the shipped bundle's, from `attnserve evaluate --write`


def test_graphs_their_files_and_variants() -> None:
    manifest = Manifest.read(FIXTURES / TINY_INT8)
    float32 = ["encoder.onnx", "decoder.onnx", "decoder.fast.onnx", "decoder.forced.onnx", "decoder.device.onnx"]
    assert manifest.graph_files == float32
    assert manifest.variants == ["float32", "int8"] and manifest.default_variant == "float32"
    manifest.graphs["float16"] = {"encoder": "encoder.float16.onnx", "decoder": "decoder.float16.onnx"}
    manifest.default_variant = "int8"
    assert manifest.graph_files == float32 and manifest.variants == ["float32", "int8", "float16"]
    assert manifest.default_variant == "int8"


def test_graph_forms_and_derived_entries_are_added() -> None:
    manifest = Manifest.read(FIXTURES / TINY)
    forms = dict(manifest.graph_forms)
    assert manifest.derived == {}
    new = {"role": "encoder", "attentions": False}
    manifest.add_graph_forms({"encoder.int8.onnx": new, "encoder.onnx": new})
    assert manifest.graph_forms == {**forms, "encoder.onnx": new, "encoder.int8.onnx": new}
    entry = {"from": "encoder.fast.onnx", "by": "int8-per-channel", "onnxruntime": "1.0"}
    manifest.add_derived({"encoder.int8.onnx": entry})
    manifest.add_derived({"decoder.int8.onnx": {**entry, "from": "decoder.fast.onnx"}})
    assert list(manifest.derived) == ["encoder.int8.onnx", "decoder.int8.onnx"]
    bare = Manifest({})
    bare.add_graph_forms({"encoder.onnx": new})
    assert bare.graph_forms == {"encoder.onnx": new}


def test_weight_aliases_name_the_tied_embedding() -> None:
    aliases = Manifest.read(FIXTURES / TINY).weight_aliases
    assert aliases == {"tgt_embed.lut.weight": "src_embed.lut.weight", "generator.proj.weight": "src_embed.lut.weight"}


def test_a_missing_or_broken_manifest_is_a_manifest_error(tmp_path: Path) -> None:
    assert not is_bundle(tmp_path)
    with pytest.raises(ManifestError, match=r"no manifest\.json"):
        Manifest.read(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")  # deliberately broken: raw text
    assert is_bundle(tmp_path)
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.read(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps([1]))
    with pytest.raises(ManifestError, match="holds a list"):
        Manifest.read(tmp_path)
