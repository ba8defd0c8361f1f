"""Tests of model/export/quantize.py: the int8 and float16 variants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from model.export.bundle import export_bundle
from model.export.quantize import add_float16, add_int8
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.runner import open_runner
from tests.bundles import tiny_model


def test_int8_variant(spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365)
    kwargs = {"name": "x", "source_lang": "en", "target_lang": "ja", "tokenizer": {"source": spm, "target": spm}}
    bundle_dir = export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    add_int8(bundle_dir)
    bundle = load_bundle(bundle_dir)  # checks every file's sha256, the int8 graphs' included
    assert bundle.variants == ["float32", "int8"]
    src = bundle.tokenizer.encode_source("Open file")
    exact = decode(open_runner(bundle, "cpu"), [DecodeRequest(src=src, max_length=6)])[0]
    int8 = open_runner(bundle, "cpu", variant="int8")
    assert not int8.attention  # the fused encoder and decoder have no attention outputs
    assert int8.encode(*(np.array([x]) for x in (src, [1] * len(src), range(len(src))))).attentions is None
    approx = decode(int8, [DecodeRequest(src=src, max_length=6)])[0]
    assert len(approx.hypotheses[0].tokens) == len(exact.hypotheses[0].tokens)
    assert abs(approx.hypotheses[0].score - exact.hypotheses[0].score) < 0.5 * abs(exact.hypotheses[0].score)


def test_float16_variant(spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365)
    kwargs = {"name": "x", "source_lang": "en", "target_lang": "ja", "tokenizer": {"source": spm, "target": spm}}
    bundle_dir = export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    add_float16(bundle_dir)  # checked against PyTorch within FLOAT16_TOLERANCE
    bundle = load_bundle(bundle_dir)  # checks every file's sha256, the float16 graphs' included
    assert bundle.variants == ["float32", "float16"]
    graph = onnx.load(str(bundle.graph("decoder", "float16"))).graph
    assert onnx.TensorProto.FLOAT16 in {i.data_type for i in graph.initializer}
    assert all(o.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16 for o in graph.output)  # float32 outside
    src = bundle.tokenizer.encode_source("Open file")
    request = DecodeRequest(src=src, max_length=6, attention=True)
    exact = decode(open_runner(bundle, "cpu"), [request])[0].hypotheses[0]
    half = open_runner(bundle, "cpu", variant="float16")
    assert half.attention  # the exact graphs, converted: attention outputs included
    approx = decode(half, [request])[0].hypotheses[0]
    assert approx.tokens == exact.tokens
    np.testing.assert_allclose(approx.token_scores, exact.token_scores, atol=0.05)
    np.testing.assert_allclose(np.stack(approx.cross_attention), np.stack(exact.cross_attention), atol=0.02)
