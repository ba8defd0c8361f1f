"""model/export/store.py: every graph's weights in one weights.bin, each distinct tensor once, read back exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from model.export.bundle import export_bundle
from model.export.quantize import add_int8
from model.export.store import INLINE_BELOW, WEIGHTS, add_weights, store_weights_once
from service.runtime.bundle import BundleError, load_bundle
from tests.bundles import tiny_model

GRAPHS = ["encoder.onnx", "decoder.onnx", "decoder.fast.onnx", "encoder.fast.onnx"]


@pytest.fixture(scope="module")
def bundle(spm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("store") / "bundle"
    tok = {"source": spm, "target": spm}
    add_int8(export_bundle(tiny_model(365), out, name="t", source_lang="en", target_lang="ja", tokenizer=tok))
    return out


def regions(path: Path) -> dict[str, tuple[int, int]]:
    """Each external initializer of a graph: name -> (offset, length) in WEIGHTS."""
    out = {}
    for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            assert info["location"] == WEIGHTS
            out[tensor.name] = (int(info["offset"]), int(info["length"]))
    return out


def test_large_initializers_live_in_the_shared_file_small_ones_inline(bundle: Path) -> None:
    for name in GRAPHS:
        graph = onnx.load(str(bundle / name), load_external_data=False).graph
        for tensor in graph.initializer:
            external = tensor.data_location == TensorProto.EXTERNAL
            assert external == (len(numpy_helper.to_array(tensor, str(bundle)).tobytes()) >= INLINE_BELOW)


def test_each_distinct_tensor_is_stored_once(bundle: Path) -> None:
    data = (bundle / WEIGHTS).read_bytes()
    spans = {span for name in GRAPHS for span in regions(bundle / name).values()}
    contents = [data[o : o + n] for o, n in spans]
    assert len(set(contents)) == len(contents)  # no two regions hold the same bytes
    assert sum(n for _, n in spans) <= len(data) < sum(n for _, n in spans) + 4096 * len(spans)
    # the decoder's weights are the fast decoder's: every one of decoder.onnx's regions is also the fast decoder's
    decoder, fast = regions(bundle / "decoder.onnx"), regions(bundle / "decoder.fast.onnx")
    shared = set(decoder.values()) & set(fast.values())
    assert len(shared) >= len(decoder) // 2


def test_weights_read_back_exactly(bundle: Path, tmp_path: Path) -> None:
    """Storing again (from graphs that already point into WEIGHTS) gives the same bytes, and the arrays are the
    self-contained graphs' arrays."""
    copy = Path(shutil.copytree(bundle, tmp_path / "copy"))
    before = {name: (copy / name).read_bytes() for name in [*GRAPHS, WEIGHTS]}
    store_weights_once(copy, GRAPHS)
    assert {name: (copy / name).read_bytes() for name in [*GRAPHS, WEIGHTS]} == before
    for name in GRAPHS:
        whole = onnx.load(str(copy / name))  # external data read in
        onnx.save(whole, str(tmp_path / name))
        inline = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / name)).graph.initializer}
        stored = {t.name: numpy_helper.to_array(t) for t in whole.graph.initializer}
        assert inline.keys() == stored.keys()
        assert all(np.array_equal(inline[k], stored[k]) for k in inline)


def test_a_missing_or_damaged_weights_file_is_named(bundle: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(bundle, tmp_path / "copy"))
    (copy / WEIGHTS).write_bytes((copy / WEIGHTS).read_bytes()[:-1])
    with pytest.raises(BundleError, match=r"weights\.bin: sha256 does not match"):
        load_bundle(copy)
    (copy / WEIGHTS).unlink()
    with pytest.raises(BundleError, match=r"weights\.bin is missing"):
        load_bundle(copy)


def test_new_graphs_point_at_the_weights_there_and_append_the_rest(bundle: Path, tmp_path: Path) -> None:
    """add_weights: a new graph's weights found in WEIGHTS are pointed at, the others appended; every other file
    and WEIGHTS' first bytes stay."""
    copy = Path(shutil.copytree(bundle, tmp_path / "copy"))
    before = {name: (copy / name).read_bytes() for name in [*GRAPHS, WEIGHTS]}
    shared = onnx.load(str(copy / "decoder.onnx"))  # every weight the bundle holds already
    extra = onnx.load(str(copy / "decoder.onnx"))
    extra.graph.initializer.append(numpy_helper.from_array(np.arange(512, dtype=np.float32), "extra"))
    onnx.save(shared, str(copy / "shared.onnx"))
    onnx.save(extra, str(copy / "extra.onnx"))
    assert add_weights(copy, ["shared.onnx"]) == len(before[WEIGHTS])
    assert {name: (copy / name).read_bytes() for name in [*GRAPHS, WEIGHTS]} == before
    assert regions(copy / "shared.onnx") == regions(copy / "decoder.onnx")
    grown = add_weights(copy, ["extra.onnx"])
    assert len(before[WEIGHTS]) + 2048 <= grown < len(before[WEIGHTS]) + 2048 + 64
    assert (copy / WEIGHTS).read_bytes()[: len(before[WEIGHTS])] == before[WEIGHTS]
    stored = {
        t.name: numpy_helper.to_array(t, str(copy)) for t in onnx.load(str(copy / "extra.onnx")).graph.initializer
    }
    np.testing.assert_array_equal(stored["extra"], np.arange(512, dtype=np.float32))
