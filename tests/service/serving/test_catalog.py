"""What a set of bundles serves, read from manifests alone: the bundle an in-process command picks; what a bundle's
sessions hold, read from its graphs' headers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from service.runtime.bundle import load_bundle
from service.runtime.manifest import Manifest
from service.serving.catalog import bundle_for, footprint, loaded_bytes, served_graphs, weight_bytes
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


def graph(path: Path, initializers: list[onnx.TensorProto], casts: list[str]) -> Path:
    """An ONNX graph holding ``initializers``, each name of ``casts`` behind a Cast to float32 (as a bundle stores
    float16 weights)."""
    nodes = [onnx.helper.make_node("Cast", [n], [f"{n}.cast"], to=onnx.TensorProto.FLOAT) for n in casts]
    out = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    nodes.append(onnx.helper.make_node("Identity", [initializers[0].name], ["y"]))
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", [], [out], initializers)), path)
    return path


def test_weight_bytes_counts_float16_cast_to_float32_as_float32_and_int8_as_int8(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w")
    h = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float16), "h.float16")
    kept = numpy_helper.from_array(rng.standard_normal((3,)).astype(np.float16), "kept")  # no Cast: float16
    q = numpy_helper.from_array(rng.integers(-127, 128, (16, 8)).astype(np.int8), "q")
    scale = numpy_helper.from_array(rng.random(8).astype(np.float32), "q.scale")
    assert weight_bytes(graph(tmp_path / "f32.onnx", [w], [])) == 4 * 8 * 4
    assert weight_bytes(graph(tmp_path / "f16.onnx", [w, h, kept], ["h.float16"])) == 4 * 8 * 4 + 8 * 8 * 4 + 3 * 2
    assert weight_bytes(graph(tmp_path / "i8.onnx", [scale, q], [])) == 16 * 8 + 8 * 4


def held(graph_file: Path) -> int:
    """A graph's initializers with their data read, float16 feeding a Cast counted twice over."""
    model = onnx.load(str(graph_file))
    cast = {n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    return sum(numpy_helper.to_array(t).nbytes * (2 if t.name in cast else 1) for t in model.graph.initializer)


@pytest.mark.parametrize("variant", ["float32", "int8"])
def test_loaded_bytes_counts_each_session_of_the_variant_once(tiny_int8_bundle: Path, variant: str) -> None:
    """The served graphs (float32: the exact encoder and the fast decoder; int8: its encoder and decoder), then the
    exact graphs /attention opens (the encoder, shared with float32's fast runner, once)."""
    manifest = Manifest.read(tiny_int8_bundle)
    served = {"float32": ["encoder.onnx", "decoder.fast.onnx"], "int8": ["encoder.int8.onnx", "decoder.int8.onnx"]}
    exact = ["encoder.onnx", "decoder.onnx", "decoder.forced.onnx"]
    assert served_graphs(manifest, variant, exact=False) == served[variant]
    assert served_graphs(manifest, variant) == list(dict.fromkeys(served[variant] + exact))
    for with_exact in (False, True):
        files = served_graphs(manifest, variant, with_exact)
        expected = sum(held(tiny_int8_bundle / f) for f in files)
        assert loaded_bytes(tiny_int8_bundle, manifest, variant, with_exact) == expected
    assert footprint(load_bundle(tiny_int8_bundle), variant) == loaded_bytes(tiny_int8_bundle, manifest, variant)


def test_loaded_bytes_counts_float16_stored_weights_as_float32(tiny_bundle: Path, tmp_path: Path) -> None:
    """A bundle whose weights.bin holds float16 behind Casts (``attnserve export --store float16``) counts as the same
    bundle stored in float32, and takes half its disk."""
    half = Path(shutil.copytree(tiny_bundle, tmp_path / "half"))
    manifest = Manifest.read(half)
    for name in served_graphs(manifest, "float32"):
        model = onnx.load(str(half / name))
        to_float16(model)
        onnx.save(model, str(half / name), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{name}.weights", size_threshold=0)  # fmt: skip
    full = loaded_bytes(tiny_bundle, manifest, "float32")
    assert loaded_bytes(half, manifest, "float32") == full
    stored = sum(numpy_helper.to_array(t).nbytes for f in served_graphs(manifest, "float32")
                 for t in onnx.load(str(half / f)).graph.initializer)  # fmt: skip
    assert stored < 0.6 * full


def to_float16(model: onnx.ModelProto) -> None:
    """Every float32 initializer of ``model`` stored as ``<name>.float16`` behind a Cast to float32 named ``<name>``,
    as model/export stores float16 weights."""
    g = model.graph
    for i, t in enumerate(list(g.initializer)):
        values = numpy_helper.to_array(t)
        if t.data_type != onnx.TensorProto.FLOAT or np.abs(values).max(initial=0) > 65504:  # kept as float32
            continue
        half = numpy_helper.from_array(values.astype(np.float16), f"{t.name}.float16")
        g.initializer[i].CopyFrom(half)
        g.node.insert(0, onnx.helper.make_node("Cast", [half.name], [t.name], to=onnx.TensorProto.FLOAT))
