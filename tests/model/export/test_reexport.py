"""model/export/reexport.py: a bundle exported again from its own weights, as float16 or float32, every graph,
variant and manifest field kept, the int8 graphs derived from the float16-stored fast graphs."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto

from model.cli import main
from model.export.bundle import export_bundle, round_to_float16
from model.export.reexport import export_from_bundle
from model.export.store import WEIGHTS
from model.export.weights import load_model, load_state_dict
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.manifest import Manifest
from service.runtime.runner import open_runner
from service.serving.confidence import FEATURES
from tests.bundles import SENTENCES
from tests.conftest import FIXTURES, TINY_INT8

SHIPPED = ["encoder.onnx", "decoder.onnx", "decoder.fast.onnx", "decoder.forced.onnx", "decoder.device.onnx",
           "encoder.fast.onnx"]  # fmt: skip
INT8 = ["encoder.int8.onnx", "decoder.int8.onnx"]
CALIBRATION = {
    "features": list(FEATURES),
    "mean": [0.0] * len(FEATURES),
    "scale": [1.0] * len(FEATURES),
    "weights": [1.0] + [0.0] * (len(FEATURES) - 1),
    "bias": 0.0,
    "curve": {"x": [-10.0, 0.0], "y": [0.0, 1.0]},
    "layers": [-1],
    "omission_threshold": 0.1,
    "copy_threshold": 0.8,
}
SCORE = {"metric": "chrF", "value": 12.5, "decoding": "greedy", "test_set": "t", "command": "c"}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny int8 bundle (float32-stored) with scores, a calibration, model languages and a source suffix."""
    path = Path(shutil.copytree(FIXTURES / TINY_INT8, tmp_path_factory.mktemp("source") / "bundle"))
    manifest = Manifest.read(path)
    manifest.tokenizer["source_suffix"] = [manifest.model["eos_id"]]
    manifest.data["model_languages"] = {"source": "eng", "target": "jpn"}
    manifest.calibration, manifest.scores = CALIBRATION, [SCORE]
    manifest.write(path)
    load_bundle(path)  # derives its int8 graphs
    return path


@pytest.fixture(scope="module")
def restored(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_from_bundle(source, tmp_path_factory.mktemp("restored") / "bundle", float16=True)


def external_types(path: Path) -> set[int]:
    """The data types of a graph's initializers stored in the weights file."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return {t.data_type for t in graph.initializer if t.data_location == TensorProto.EXTERNAL}


def tokens(bundle_dir: Path) -> list[list[int]]:
    """Greedy and beam-4 tokens of every test sentence on the exact, fast and int8 graphs."""
    bundle = load_bundle(bundle_dir)
    sources = [bundle.tokenizer.encode_source(s) for s in SENTENCES]
    out = []
    for runner in (
        open_runner(bundle, "cpu"),
        open_runner(bundle, "cpu", role="fast_decoder"),
        open_runner(bundle, "cpu", variant="int8"),
    ):
        for beam in (1, 4):
            results = decode(runner, [DecodeRequest(src=s, beam_size=beam, max_length=12) for s in sources])
            out += [r.hypotheses[0].tokens for r in results]
    return out


def test_every_manifest_field_is_kept(source: Path, restored: Path) -> None:
    before, after = (Manifest.read(p).data for p in (source, restored))
    assert after.keys() == before.keys()
    stored = ("sha256", "weights", "provenance", "derived")
    assert {k: v for k, v in after.items() if k not in stored} == {k: v for k, v in before.items() if k not in stored}
    assert after["provenance"].pop("re_exported")["store"] == "float16"
    assert after["provenance"] == before["provenance"]
    assert after["weights"]["aliases"] == before["weights"]["aliases"]
    assert "float16" in after["weights"]["stored"] and "float16" not in before["weights"]["stored"]
    assert set(after["sha256"]) == set(before["sha256"]) and set(after["derived"]) == set(INT8)
    assert {k: e["from"] for k, e in after["derived"].items()} == {k: e["from"] for k, e in before["derived"].items()}
    assert load_bundle(restored).variants == ["float32", "int8"]  # every file's sha256 checked, int8 included


def test_every_shipped_graph_stores_float16_and_reads_back_the_rounded_weights(source: Path, restored: Path) -> None:
    for name in SHIPPED:
        # int8: the fast decoder's greedy screening of the projection, made again from the rounded weights
        assert external_types(source / name) - {TensorProto.INT8} == {TensorProto.FLOAT}
        assert external_types(restored / name) - {TensorProto.INT8} == {TensorProto.FLOAT16}
    assert (restored / WEIGHTS).stat().st_size < 0.6 * (source / WEIGHTS).stat().st_size
    want = round_to_float16(load_model(source)).state_dict()
    _, got = load_state_dict(restored)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_the_int8_graphs_derive_again_from_the_float16_stored_fast_graphs(restored: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(restored, tmp_path / "copy"))
    for name in INT8:
        (copy / name).unlink()
    load_bundle(copy)  # derives them again and checks them against the manifest's sha256
    for name in INT8:
        assert (copy / name).read_bytes() == (restored / name).read_bytes()
        graph = onnx.load(str(copy / name)).graph
        assert TensorProto.FLOAT16 not in {t.data_type for t in graph.initializer}  # the casts were folded
        assert sum(n.op_type == "MatMulInteger" for n in graph.node) > 0


def test_tokens_are_a_float32_export_of_the_same_float16_values(source: Path, restored: Path, tmp_path: Path) -> None:
    """Storage changes nothing but the values: every graph of the float16-stored bundle, int8 included, decodes as
    a float32-stored bundle of the rounded weights does."""
    spm = source / Manifest.read(source).tokenizer["source"]
    same = export_bundle(round_to_float16(load_model(source)).eval(), tmp_path / "f32", name="t", source_lang="en",
                         target_lang="ja", tokenizer={"source": spm, "target": spm})  # fmt: skip
    assert main(["export", str(same), str(same), "--force", "--int8"]) == 0  # the CLI adds int8, keeps float32
    assert external_types(same / "decoder.onnx") == {TensorProto.FLOAT}
    assert tokens(restored) == tokens(same)


def test_in_place_only_with_force_and_back_to_float32(source: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(source, tmp_path / "bundle"))
    assert main(["export", str(path), str(path), "--store", "float16"]) == 2  # exists: --force needed
    assert external_types(path / "decoder.onnx") == {TensorProto.FLOAT}
    assert main(["export", str(path), str(path), "--store", "float16", "--force"]) == 0
    assert external_types(path / "decoder.onnx") == {TensorProto.FLOAT16}
    _, half = load_state_dict(path)
    assert main(["export", str(path), str(path), "--force"]) == 0  # auto: the bundle's own dtype
    assert external_types(path / "decoder.onnx") == {TensorProto.FLOAT16}
    assert main(["export", str(path), str(tmp_path / "back"), "--store", "float32"]) == 0
    assert external_types(tmp_path / "back" / "decoder.onnx") == {TensorProto.FLOAT}
    _, back = load_state_dict(tmp_path / "back")
    assert all(torch.equal(back[k], half[k]) for k in half)
    assert Manifest.read(tmp_path / "back").calibration == CALIBRATION
