"""The Transformer's pieces as ONNX nodes, each the computation of its namesake in model/transformer.py (which the
equality tests hold them to): embeddings, LayerNorm, linear maps, the feed-forward network, scaled dot-product
attention and the stacks' sub-layers. Values are named by string; shapes in the comments as in transformer.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from model.export.builder.ops import Graph
from model.export.builder.weights import sinusoids

LOWEST = np.finfo(np.float32).min  # masked scores: exp() of it is exactly 0, and a row never becomes NaN


def linear(g: Graph, x: str, prefix: str, bias: bool = True) -> str:
    """x W^T + b of the state dict's ``{prefix}.weight`` (out, in) and ``{prefix}.bias``."""
    y = g.op("MatMul", x, g.op("Transpose", g.weight(f"{prefix}.weight"), perm=[1, 0]))
    return g.op("Add", y, g.weight(f"{prefix}.bias")) if bias else y


def layer_norm(g: Graph, x: str, prefix: str) -> str:
    return g.op("LayerNormalization", x, g.weight(f"{prefix}.weight"), g.weight(f"{prefix}.bias"), axis=-1,
                epsilon=g.c.layer_norm_eps)  # fmt: skip


def activation(g: Graph, x: str) -> str:
    """ReLU, swish (x · sigmoid(x)) or the exact GELU (x · ½ (1 + erf(x / √2)))."""
    kind = g.c.activation
    if kind == "relu":
        return g.op("Relu", x)
    if kind == "swish":
        return g.op("Mul", x, g.op("Sigmoid", x))
    erf = g.op("Erf", g.op("Div", x, g.const(math.sqrt(2), np.float32)))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.const(1, np.float32))), g.const(0.5, np.float32))


def feed_forward(g: Graph, x: str, prefix: str) -> str:
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2."""
    return linear(g, activation(g, linear(g, x, f"{prefix}.feed_forward.w_1")), f"{prefix}.feed_forward.w_2")


def embed(g: Graph, ids: str, positions: str, side: str) -> str:
    """ids, positions (B, T) -> token embedding × √d_model (optional) + position (B, T, d_model); ``side`` src or
    tgt."""
    x = g.op("Gather", g.weight(f"{side}_embed.lut.weight"), ids)
    if g.c.scale_embedding:
        x = g.op("Mul", x, g.const(math.sqrt(g.c.d_model), np.float32))
    return g.op("Add", x, g.op("Gather", position_table(g, side), positions))


def position_table(g: Graph, side: str) -> str:
    """The positions' table (max_positions, d_model): a weight (``position_table="weights"``), or the sinusoids
    computed here, a constant of the graph (no weight: the weights file stores only the model's)."""
    if g.c.position_table == "weights":
        return g.weight(f"{side}_embed.pe")
    return g.constant("sinusoids", lambda: sinusoids(g.c.max_positions, g.c.d_model))


def sublayer(g: Graph, x: str, prefix: str, inner: Callable[[str], tuple[str, Any]]) -> tuple[str, Any]:
    """LayerNorm(x + Sublayer(x)) (post-LN), or x + Sublayer(LayerNorm(x)) (pre-LN); passes ``inner``'s extra on."""
    norm = f"{prefix}.norm"
    if g.c.normalize_before:
        out, extra = inner(layer_norm(g, x, norm))
        return g.op("Add", x, out), extra
    out, extra = inner(x)
    return layer_norm(g, g.op("Add", x, out), norm), extra


def feed_forward_sublayer(g: Graph, x: str, layer: str, i: int) -> str:
    """The feed-forward network of ``layer`` as its sub-layer ``i``."""
    out, _ = sublayer(g, x, f"{layer}.sublayer.{i}", lambda y: (feed_forward(g, y, layer), None))
    return out


def final_norm(g: Graph, x: str, stack: str) -> str:
    """A pre-LN stack's final LayerNorm (``stack``: encoder or decoder); post-LN layers end with one already."""
    return layer_norm(g, x, f"{stack}_norm") if g.c.normalize_before else x


def split_heads(g: Graph, x: str) -> str:
    """(B, T, d_model) -> (B, h, T, d_k)."""
    return g.op("Transpose", g.op("Reshape", x, g.const([0, 0, g.c.h, g.c.d_k])), perm=[0, 2, 1, 3])


def merge_heads(g: Graph, x: str) -> str:
    """(B, h, T, d_k) -> (B, T, d_model)."""
    return g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 1, 3]), g.const([0, 0, g.c.d_model]))


def project_kv(g: Graph, x: str, prefix: str) -> tuple[str, str]:
    """(B, T, d_model) -> keys and values of the attention ``prefix``, each (B, h, T, d_k)."""
    return split_heads(g, linear(g, x, f"{prefix}.W_K")), split_heads(g, linear(g, x, f"{prefix}.W_V"))


def attention_weights(g: Graph, x: str, K: str, mask: str, prefix: str) -> str:
    """softmax(QKᵀ/√d_k + mask) of the queries of x (B, T_q, d_model) on keys (B, h, T_k, d_k); mask bool,
    broadcastable to (B, h, T_q, T_k) -> (B, h, T_q, T_k), masked weights exactly 0."""
    Q = split_heads(g, linear(g, x, f"{prefix}.W_Q"))
    scores = g.op("Div", g.op("MatMul", Q, g.op("Transpose", K, perm=[0, 1, 3, 2])),
                  g.const(math.sqrt(g.c.d_k), np.float32))  # fmt: skip
    return g.op("Softmax", g.op("Where", mask, scores, g.const(LOWEST, np.float32)), axis=-1)


def attention(g: Graph, x: str, K: str, V: str, mask: str, prefix: str) -> tuple[str, str]:
    """Multi-head attention of x (B, T_q, d_model) on projected K, V -> (B, T_q, d_model) and its weights."""
    weights = attention_weights(g, x, K, mask, prefix)
    return linear(g, merge_heads(g, g.op("MatMul", weights, V)), f"{prefix}.W_O"), weights


def padding_mask(g: Graph, mask: str) -> str:
    """(B, S) with 1 for real tokens -> bool (B, 1, 1, S)."""
    return g.op("Unsqueeze", g.op("Not", g.op("Equal", mask, g.const(0))), g.const([1, 2]))


def stack(g: Graph, values: list[str], axis: int = 0) -> str:
    """torch.stack: each value unsqueezed at ``axis``, then concatenated."""
    return g.op("Concat", *(g.op("Unsqueeze", v, g.const([axis])) for v in values), axis=axis)


def last_position(g: Graph, x: str) -> str:
    """x[:, -1]: (B, T, d_model) -> (B, d_model)."""
    return g.op("Gather", x, g.const(-1), axis=1)


def generator(g: Graph, x: str) -> str:
    """The pre-softmax projection (+ the final logits bias): (..., d_model) -> (..., V)."""
    logits = linear(g, x, "generator.proj", bias=False)
    return g.op("Add", logits, g.weight("generator.final_logits_bias")) if g.c.final_logits_bias else logits
