"""The device decoder (model/export/build.py's export_device_decoder, bundle.py's add_device, quantize.py's float16
variant): PyTorch's step in standard operators, added to a bundle from its own weights with every other file kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from model.export.build import export_device_decoder
from model.export.bundle import DEVICE, add_device
from model.export.check import FLOAT16_TOLERANCE, TOLERANCE
from model.export.names import device_decoder_inputs, device_decoder_outputs
from model.export.quantize import DEVICE_FLOAT16, add_float16
from model.export.reexport import export_from_bundle
from model.export.store import WEIGHTS
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.manifest import MANIFEST, Manifest, sha256
from service.runtime.runner import open_runner
from tests.bundles import SENTENCES, tiny_model
from tests.conftest import FIXTURES, TINY, TINY_INT8
from tests.model.export.shapes import CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_device_decoder_matches_pytorch_in_standard_operators(name: str, tmp_path: Path) -> None:
    """Rows reordered onto their parents' caches and sharing sources: PyTorch's logits (the best ones, the log
    normalizer, the greedy token) and presents, float32 within 1e-4 and float16 within 0.1, from ONNX's own
    operators alone (CUDA's and the CPU's)."""
    model = tiny_model(365, seed=1, **CONFIGS[name])
    L = model.config.n_decoder_layers
    for float16, tolerance in ((False, TOLERANCE), (True, FLOAT16_TOLERANCE)):
        path = tmp_path / f"device.{float16}.onnx"
        assert export_device_decoder(model, path, float16=float16) <= tolerance
        graph = onnx.load(str(path)).graph
        assert {n.domain for n in graph.node} <= {"", "ai.onnx"}
        assert [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}] == (
            device_decoder_inputs(L)
        )
        assert [o.name for o in graph.output] == device_decoder_outputs(L)
        types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
        cache = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
        assert {types[n] for n in types if n.startswith(("cross_", "past_", "present_"))} == {cache}
        assert (types["candidate_logits"], types["log_norm"]) == (TensorProto.FLOAT, TensorProto.FLOAT)


def without_device(source: Path, tmp_path: Path) -> Path:
    """A copy of a bundle as exported before the device decoder."""
    bundle = Path(shutil.copytree(source, tmp_path / "bundle"))
    manifest = Manifest.read(bundle)
    del manifest.graphs["device_decoder"], manifest.graph_forms[DEVICE]
    (bundle / DEVICE).unlink()
    manifest.write_with_checksums(bundle)
    return bundle


@pytest.mark.parametrize("store", ["float32", "float16"])
def test_add_device_keeps_every_other_file(store: str, tmp_path: Path) -> None:
    """Added to a bundle (float32-stored, or float16-stored as model/bundles/en-ja), the device decoder points at
    the weights the bundle holds: no other file changes, nor the weights file."""
    source = FIXTURES / TINY
    if store == "float16":
        source = export_from_bundle(FIXTURES / TINY_INT8, tmp_path / "float16", float16=True)
    bundle = without_device(source, tmp_path)
    before = {p.name: sha256(p) for p in bundle.iterdir() if p.name != MANIFEST}

    assert add_device(bundle) == (bundle / WEIGHTS).stat().st_size

    after = {p.name: sha256(p) for p in bundle.iterdir() if p.name != MANIFEST}
    assert {k: v for k, v in after.items() if k != DEVICE} == before
    loaded = load_bundle(bundle)  # every sha256 verified, the derived int8 graphs' too
    assert loaded.form("device_decoder").candidates
    if store == "float32":  # as the exporter writes it
        assert after[DEVICE] == sha256(FIXTURES / TINY / DEVICE)
    requests = [DecodeRequest(src=loaded.tokenizer.encode_source(t), beam_size=2, max_length=8) for t in SENTENCES]
    exact = decode(open_runner(loaded, "cpu"), requests)
    device = decode(open_runner(loaded, "cpu", role="device_decoder"), requests)
    assert [r.hypotheses[0].tokens for r in device] == [r.hypotheses[0].tokens for r in exact]


def test_the_float16_variant_decodes_on_float16_caches(tmp_path: Path) -> None:
    """The float16 variant's device decoder: float16 caches from the encoder's (cast once) to the presents, scores
    in float32, the float32 graphs' tokens; its weights are the float16-stored bundle's own."""
    bundle = export_from_bundle(FIXTURES / TINY, tmp_path / "bundle", float16=True)
    size = (bundle / WEIGHTS).stat().st_size
    add_float16(bundle)
    assert (bundle / WEIGHTS).stat().st_size == size  # each float16 weight stored once already
    loaded = load_bundle(bundle)
    assert loaded.graph("device_decoder", "float16").name == DEVICE_FLOAT16
    half = open_runner(loaded, "cpu", variant="float16", role="device_decoder")
    assert half.form.candidates and half.tensors.empty((1, 1, 1, 1)).data_type() == "tensor(float16)"
    requests = [DecodeRequest(src=loaded.tokenizer.encode_source(t), beam_size=b, max_length=6)
                for t in SENTENCES[:6] for b in (1, 3)]  # fmt: skip
    exact, approx = decode(open_runner(loaded, "cpu"), requests), decode(half, requests)
    same = [a.hypotheses[0].tokens == b.hypotheses[0].tokens for a, b in zip(exact, approx, strict=True)]
    assert sum(same) >= len(same) - 1  # float16 may break a near tie
    for a, b in zip(exact, approx, strict=True):
        if a.hypotheses[0].tokens == b.hypotheses[0].tokens:
            np.testing.assert_allclose(
                a.hypotheses[0].token_scores, b.hypotheses[0].token_scores, atol=FLOAT16_TOLERANCE
            )
