"""Tests of model/export/build.py: the fast encoder and decoder against PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from model.export.build import export_fast_decoder, export_fast_encoder
from model.transformer import Transformer
from service.runtime.kernels import (
    Kernels,
    kernel_session,
)
from tests.bundles import tiny_model
from tests.model.export.shapes import CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_fast_encoder_fuses_attention_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    """encoder.fast.onnx (what the int8 variant quantizes): the exact encoder's cross keys and values, on a batch with
    padding and two texts packed in a row, from one attnserve.SegmentAttention a layer and no attention output."""
    model = tiny_model(365, seed=1, **CONFIGS[name])
    path = tmp_path / "encoder.fast.onnx"
    assert export_fast_encoder(model, path) <= 1e-4
    graph = onnx.load(str(path)).graph
    ops = [(n.domain, n.op_type) for n in graph.node]
    assert ops.count(("attnserve", "SegmentAttention")) == model.config.n_encoder_layers
    assert "Softmax" not in [op for _, op in ops]
    assert [o.name for o in graph.output] == [
        f"{kind}.{l}" for kind in ("cross_keys", "cross_values") for l in range(model.config.n_decoder_layers)
    ]


KERNEL_OPS = {
    "attnserve": (("attnserve", "CachedAttention"), ("attnserve", "Attention")),
    "onnxruntime": (("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "MultiHeadAttention")),
}


@pytest.mark.parametrize("kernels", ["attnserve", "onnxruntime"])
def test_fast_decoder_fuses_attention_and_matches_pytorch(tmp_path: Path, kernels: Kernels) -> None:
    path = tmp_path / "decoder.fast.onnx"
    assert export_fast_decoder(tiny_model(365), path, kernels=kernels) <= 1e-4  # logits, each row's cache slots
    graph = onnx.load(str(path)).graph
    ops = [(n.domain, n.op_type) for n in graph.node]
    self_attention, cross_attention = KERNEL_OPS[kernels]
    assert ops.count(self_attention) == 2  # 2 decoder layers
    assert ops.count(cross_attention) == 2
    assert len({d for d, _ in ops if d}) == 1  # one domain of attention kernels
    assert "self_attention_mask" not in [i.name for i in graph.input]
    # attnserve's form computes logits or greedy tokens (screened in int8, checked in float32) by row.
    greedy = kernels == "attnserve"
    assert ("logit_rows" in [i.name for i in graph.input]) == greedy
    assert [o.name for o in graph.output] == [
        "logits",
        *(["tokens"] if greedy else []),
        *(f"present_{k}.{l}" for k in ("keys", "values") for l in (0, 1)),
    ]
    assert (("attnserve", "GreedyTokens") in ops) == greedy
    # A step reads no dimension off a tensor but the number of sources (the cross keys'): the other reshapes are
    # written with the model's sizes, not as node chains that run at every step.
    shapes = [n.input[0] for n in graph.node if n.op_type == "Shape"]
    assert sorted(shapes) == ["cross_keys.0", "cross_keys.1"]


def test_fast_decoder_reads_no_slot_past_a_rows_length(
    fast_decoder: tuple[Transformer, Path, dict[str, np.ndarray]],
) -> None:
    """The service leaves the slots of grown cache buffers unwritten (service/decoding/in_place.py): whatever
    they hold past each row's length, NaN and infinity included, the step is the same."""

    _, path, feed = fast_decoder
    lengths = feed["position_ids"][:, 0]
    session = kernel_session(path)
    steps = []
    for stale in (0.0, np.nan, np.inf):
        filled = {k: v.copy() for k, v in feed.items()}
        for name in (k for k in filled if k.startswith("past_")):
            for b, n in enumerate(lengths):
                filled[name][b, :, n:] = stale
        steps.append(session.run(["logits"], filled)[0])
    assert np.isfinite(steps[0]).all()
    np.testing.assert_array_equal(steps[1], steps[0])
    np.testing.assert_array_equal(steps[2], steps[0])


def test_fast_decoder_groups_rows_that_share_a_source(
    fast_decoder: tuple[Transformer, Path, dict[str, np.ndarray]],
) -> None:
    """G consecutive rows may share one source's cross keys and values (a beam request's rows): the same step as
    with the source repeated for each row; the first axis of the cross inputs is named apart from the rows'."""

    model, path, feed = fast_decoder  # 3 rows with 3 sources
    G, L = 2, model.config.n_decoder_layers
    cross = [f"cross_{kind}.{l}" for kind in ("keys", "values") for l in range(L)]
    rows = {k: np.repeat(v, G, axis=0) for k, v in feed.items() if k not in (*cross, "encoder_attention_mask")}
    rows["input_ids"] = np.arange(2, 2 + 3 * G)[:, None]  # different tokens in one source's rows
    rows.update({k: np.arange(3 * G) for k in ("logit_rows", "token_rows") if k in feed})  # every row's
    sources = {k: feed[k] for k in (*cross, "encoder_attention_mask")}
    session = kernel_session(path)
    repeated = session.run(None, {**rows, **{k: np.repeat(v, G, axis=0) for k, v in sources.items()}})
    grouped = session.run(None, {**rows, **sources})
    for want, got in zip(repeated, grouped, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dims = {i.name: i.type.tensor_type.shape.dim[0].dim_param for i in onnx.load(str(path)).graph.input}
    assert dims["input_ids"] != dims["encoder_attention_mask"] == dims["cross_keys.0"]
