"""Every graph a bundle serves, built from the config and the weights (docs/ARCHITECTURE.md gives their signatures):
the exact encoder and decoder step (every attention an output), the forced decoder, the fast encoder and decoder
step for /translate on the CPU (attnserve's fused attention, caches written in place) and the device decoder step
for /translate on CUDA (standard operators, caches reordered inside the step, the selection tail after it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx

from model.config import TransformerConfig
from model.export.builder.layers import (
    attention,
    attention_weights,
    embed,
    feed_forward_sublayer,
    final_norm,
    generator,
    last_position,
    layer_norm,
    linear,
    padding_mask,
    project_kv,
    stack,
    sublayer,
)
from model.export.builder.ops import FLOAT, INT32, INT64, Graph, weight_key
from model.export.names import (
    ENCODER_INPUTS,
    FORCED_OUTPUTS,
    decoder_inputs,
    device_decoder_axes,
    device_decoder_inputs,
    encoder_axes,
    encoder_outputs,
    fast_decoder_axes,
    forced_axes,
    forced_inputs,
    step_axes,
)
from model.export.selection import append_selection

Weights = dict[str, np.ndarray]


def _cache_dims(c: TransformerConfig) -> list[int | None]:
    return [None, c.h, None, c.d_k]  # (B, h, T, d_k)


STEP_DIMS: dict[str, list[int | None]] = {
    "input_ids": [None, 1],
    "position_ids": [None, 1],
    "encoder_attention_mask": [None, None],
    "self_attention_mask": [None, None],
}


def _step_inputs(g: Graph, names: list[str]) -> None:
    """Declare a step's integer inputs: ids and positions (B, 1), masks (B, S), row indices (B,)."""
    for name in names:
        g.input(name, INT64, STEP_DIMS.get(name, [None]))


def _cache_inputs(g: Graph, names: list[str]) -> dict[str, str]:
    """Declare the float cache inputs among ``names``, (B, h, T, d_k) each."""
    return {n: g.input(n, FLOAT, _cache_dims(g.c)) for n in names if n.startswith(("cross_", "past_"))}


def _encoder_stack(g: Graph, segments_mask: str) -> tuple[str, list[str]]:
    """The exact encoder on the graph's inputs -> memory (B, S, d_model) and each layer's weights (B, h, S, S)."""
    x = embed(g, "input_ids", "position_ids", "src")
    weights = []
    for l in range(g.c.n_encoder_layers):
        p = f"encoder_layers.{l}"

        def self_attention(y: str, p: str = p) -> tuple[str, str]:
            return attention(g, y, *project_kv(g, y, f"{p}.self_attn"), segments_mask, f"{p}.self_attn")

        x, w = sublayer(g, x, f"{p}.sublayer.0", self_attention)
        x = feed_forward_sublayer(g, x, p, 1)
        weights.append(w)
    return final_norm(g, x, "encoder"), weights


def segment_mask(g: Graph, segments: str) -> str:
    """model/transformer.py's segment_mask: (B, S) text numbers -> bool (B, 1, S, S)."""
    real_key = g.op("Unsqueeze", g.op("Not", g.op("Equal", segments, g.const(0))), g.const([1]))  # (B, 1, S)
    own = g.op("Equal", g.op("Unsqueeze", segments, g.const([2])), g.op("Unsqueeze", segments, g.const([1])))
    padding_query = g.op("Unsqueeze", g.op("Equal", segments, g.const(0)), g.const([2]))  # (B, S, 1)
    return g.op("Unsqueeze", g.op("And", real_key, g.op("Or", own, padding_query)), g.const([1]))


def _encoder_io(g: Graph) -> None:
    for name in ENCODER_INPUTS:
        g.input(name, INT64, [None, None])


def _cross_outputs(g: Graph, memory: str) -> None:
    c, L = g.c, g.c.n_decoder_layers
    kv = [project_kv(g, memory, f"decoder_layers.{l}.src_attn") for l in range(L)]
    for l, (k, _) in enumerate(kv):
        g.output(k, f"cross_keys.{l}", FLOAT, [None, c.h, None, c.d_k])
    for l, (_, v) in enumerate(kv):
        g.output(v, f"cross_values.{l}", FLOAT, [None, c.h, None, c.d_k])


def encoder(c: TransformerConfig, w: Weights) -> onnx.ModelProto:
    """encoder.onnx: (input_ids, attention_mask, position_ids) -> encoder_attentions (L_enc, B, h, S, S), then per
    decoder layer its cross keys and values (B, h, S, d_k). attention_mask holds text numbers (segment_mask)."""
    g = Graph(c, w, encoder_axes(c.n_decoder_layers))
    _encoder_io(g)
    memory, weights = _encoder_stack(g, segment_mask(g, "attention_mask"))
    g.output(stack(g, weights), "encoder_attentions", FLOAT, [c.n_encoder_layers, None, c.h, None, None])
    _cross_outputs(g, memory)
    return g.model("encoder")


def fast_encoder(c: TransformerConfig, w: Weights) -> onnx.ModelProto:
    """The fast encoder (what the int8 encoder is quantized from): encoder.onnx's inputs and cross keys and values,
    each self-attention one ``attnserve.SegmentAttention`` node, no attention output."""
    L = c.n_decoder_layers
    g = Graph(c, w, {k: v for k, v in encoder_axes(L).items() if k in ENCODER_INPUTS + encoder_outputs(L, True)})
    _encoder_io(g)
    segments = g.op("Cast", "attention_mask", to=INT32)
    x = embed(g, "input_ids", "position_ids", "src")
    for l in range(c.n_encoder_layers):
        p = f"encoder_layers.{l}.self_attn"

        def self_attention(y: str, p: str = p) -> tuple[str, None]:
            q, k, v = (linear(g, y, f"{p}.{m}") for m in ("W_Q", "W_K", "W_V"))
            return linear(g, g.custom("SegmentAttention", q, k, v, segments, g.const(c.h)), f"{p}.W_O"), None

        x, _ = sublayer(g, x, f"encoder_layers.{l}.sublayer.0", self_attention)
        x = feed_forward_sublayer(g, x, f"encoder_layers.{l}", 1)
    _cross_outputs(g, final_norm(g, x, "encoder"))
    return g.model("fast_encoder")


def _decoder_stack(g: Graph, ids: str, positions: str, cross: Sequence[tuple[str, str | None]], src_mask: str,
                   self_mask: str, past: list[tuple[str, str]] | None, layers: int | None = None
                   ) -> tuple[str, list[tuple[str, str]], list[str], list[str]]:  # fmt: skip
    """model/transformer.py's Transformer.decode: x (B, T, d_model) after the stack, per layer the present keys and
    values, self- and cross-attention weights. ``layers``: stop after that many, at its cross-attention weights
    (the forced decoder's last layer needs no cross values)."""
    x = embed(g, ids, positions, "tgt")
    present, self_w, cross_w = [], [], []
    L = g.c.n_decoder_layers if layers is None else layers
    for l in range(L):
        p = f"decoder_layers.{l}"

        def masked_self_attention(y: str, p: str = p, l: int = l) -> tuple[str, tuple[tuple[str, str], str]]:
            K, V = project_kv(g, y, f"{p}.self_attn")
            if past is not None:
                K, V = g.op("Concat", past[l][0], K, axis=2), g.op("Concat", past[l][1], V, axis=2)
            out, weights = attention(g, y, K, V, self_mask, f"{p}.self_attn")
            return out, ((K, V), weights)

        x, (kv, sw) = sublayer(g, x, f"{p}.sublayer.0", masked_self_attention)
        present.append(kv)
        self_w.append(sw)
        K, V = cross[l]
        if V is None:  # the forced decoder's last layer: its weights are all it gives
            y = layer_norm(g, x, f"{p}.sublayer.1.norm") if g.c.normalize_before else x
            cross_w.append(attention_weights(g, y, K, src_mask, f"{p}.src_attn"))
            return x, present, self_w, cross_w

        def cross_attention(y: str, p: str = p, K: str = K, V: str = V) -> tuple[str, str]:
            return attention(g, y, K, V, src_mask, f"{p}.src_attn")

        x, cw = sublayer(g, x, f"{p}.sublayer.1", cross_attention)
        cross_w.append(cw)
        x = feed_forward_sublayer(g, x, p, 2)
    return final_norm(g, x, "decoder"), present, self_w, cross_w


def _pairs(names: dict[str, str], first: str, second: str, L: int) -> list[tuple[str, str]]:
    return [(names[f"{first}.{l}"], names[f"{second}.{l}"]) for l in range(L)]


def _present_outputs(g: Graph, present: list[tuple[str, str]]) -> None:
    for kind, i in (("keys", 0), ("values", 1)):
        for l, kv in enumerate(present):
            g.output(kv[i], f"present_{kind}.{l}", FLOAT, _cache_dims(g.c))


def decoder(c: TransformerConfig, w: Weights) -> onnx.ModelProto:
    """decoder.onnx: one step on the appended cache, every attention an output (docs/ARCHITECTURE.md)."""
    L = c.n_decoder_layers
    g = Graph(c, w, {**step_axes(L), "self_attentions": {1: "batch", 3: "total_length"},
                     "cross_attentions": {1: "batch", 3: "source_length"}})  # fmt: skip
    _step_inputs(g, decoder_inputs(L)[:4])
    cache = _cache_inputs(g, decoder_inputs(L))
    x, present, self_w, cross_w = _decoder_stack(
        g, "input_ids", "position_ids", _pairs(cache, "cross_keys", "cross_values", L),
        padding_mask(g, "encoder_attention_mask"), padding_mask(g, "self_attention_mask"),
        _pairs(cache, "past_keys", "past_values", L),
    )  # fmt: skip
    g.output(generator(g, last_position(g, x)), "logits", FLOAT, [None, c.vocab_size])
    _present_outputs(g, present)
    first_query = [g.op("Squeeze", s, g.const([2])) for s in self_w]  # (B, h, T + 1) each
    g.output(stack(g, first_query), "self_attentions", FLOAT, [L, None, c.h, None])
    first_query = [g.op("Squeeze", s, g.const([2])) for s in cross_w]
    g.output(stack(g, first_query), "cross_attentions", FLOAT, [L, None, c.h, None])
    return g.model("decoder")


def forced_decoder(c: TransformerConfig, w: Weights) -> onnx.ModelProto:
    """decoder.forced.onnx: a known target teacher-forced in one call -> its cross-attention (L, B, h, T, S). It
    takes every layer's cross keys but the cross values of all layers but the last (whose values reach no
    weight)."""
    L = c.n_decoder_layers
    g = Graph(c, w, forced_axes(L))
    for name in forced_inputs(L)[:3]:
        g.input(name, INT64, [None, None])
    cache = _cache_inputs(g, forced_inputs(L))
    cross: list[tuple[str, str | None]] = [(cache[f"cross_keys.{l}"], cache.get(f"cross_values.{l}")) for l in range(L)]
    positions = g.op("Range", g.const(0), g.op("Gather", g.op("Shape", "input_ids"), g.const(1)), g.const(1))
    causal = g.op("Unsqueeze", g.op("GreaterOrEqual", g.op("Unsqueeze", positions, g.const([1])),
                                    g.op("Unsqueeze", positions, g.const([0]))), g.const([0, 1]))  # fmt: skip
    _, _, _, cross_w = _decoder_stack(g, "input_ids", "position_ids", cross,
                                      padding_mask(g, "encoder_attention_mask"), causal, None)  # fmt: skip
    g.output(stack(g, cross_w), FORCED_OUTPUTS[0], FLOAT, [L, None, c.h, None, None])
    return g.model("forced_decoder")


def screen_weights(W: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The projection W (V, d_model) as ``attnserve.GreedyTokens`` screens with it: quantized to 7-bit integers
    (int8 from -63 to 63, nearest, scaled by W's largest magnitude / 63: see service/runtime/_attention.c),
    transposed (d_model, V) for MatMulInteger; the scale (); the largest L1 norm of W's rows ()."""
    W = np.asarray(W, np.float32)
    scale = np.float32(np.abs(W).max() / np.float32(63))
    q = W / (scale if scale > 0 else np.float32(1))  # one (V, d_model) temporary, rounded and clipped in place
    np.clip(np.rint(q, out=q), -63, 63, out=q)
    quantized = np.empty(W.shape[::-1], np.int8)
    for i in range(0, len(W), 64):  # transposed a block of rows at a time: a whole-matrix transpose misses the cache
        quantized[:, i : i + 64] = q[i : i + 64].T
    rows = np.abs(W).sum(axis=1)  # float32; the rows near the largest summed again in float64
    near = np.abs(W[rows >= rows.max() * np.float32(0.999)]).astype(np.float64)
    return quantized, np.array(scale, np.float32), np.array(near.sum(axis=1).max(), np.float32)


PANEL = 16  # tokens side by side in a panel of the projection (service/runtime/_attention.c's WIDE)


def projection_panels(W: np.ndarray) -> np.ndarray:
    """The projection W (V, d_model) as ``attnserve.Logits`` reads it: (ceil(V / PANEL), d_model, PANEL), element k
    of PANEL tokens side by side, zeros past V."""
    V, d = W.shape
    padded = np.zeros((-(-V // PANEL) * PANEL, d), np.float32)
    padded[:V] = W
    return np.ascontiguousarray(padded.reshape(-1, PANEL, d).transpose(0, 2, 1))


def projection(g: Graph) -> tuple[str, str]:
    """The projection's panels and the logits' bias (V,) (zeros for a model without one): what ``attnserve.Logits``
    and ``attnserve.GreedyTokens`` compute float32 logits from, made once a graph."""
    c = g.c
    if "projection_panels" not in g.initializers:
        g.array("projection_panels", projection_panels(np.asarray(g.weights[weight_key(c, "generator.proj.weight")])))
        bias = g.weights["generator.final_logits_bias"] if c.final_logits_bias else np.zeros(c.vocab_size)
        g.array("logits_bias", np.asarray(bias, np.float32))
    return "projection_panels", "logits_bias"


def greedy_tokens(g: Graph, h: str) -> str:
    """Greedy search's next tokens of rows h (T, d_model): h quantized (DynamicQuantizeLinear) times the projection
    in 7 bits (MatMulInteger), then ``attnserve.GreedyTokens``, which bounds that product's error, rules out every
    token whose logit cannot be the largest and computes float32 logits for the few left (from W's rows), or for every
    token where too many are left (from the panels) -> (T,) int64."""
    c = g.c
    W = g.weight("generator.proj.weight")
    int8, scale, l1 = screen_weights(g.weights[weight_key(c, "generator.proj.weight")])
    panels, bias = projection(g)
    screen = [g.array("projection_scale", scale), g.array("projection_l1", l1),
              g.array("pad_id", np.array(c.pad_id, np.int64))]  # fmt: skip
    quantized, h_scale, zero = g.op("DynamicQuantizeLinear", h, outputs=3)
    acc = g.op("MatMulInteger", quantized, g.array("projection_int8", int8), zero)  # (T, V) int32
    (tokens,) = g.custom("GreedyTokens", acc, h_scale, h, W, panels, bias, *screen, outputs=["tokens"], elem=INT64)
    return tokens


def fast_decoder(c: TransformerConfig, w: Weights, greedy: bool = True) -> onnx.ModelProto:
    """decoder.fast.onnx: the step with attnserve's fused attention on caches where each row's tokens sit at its
    start (``past_keys.{l}`` (B, h, C, d_k) of any capacity C; a row's length is its position), written in place
    (``attnserve.CachedAttention``), cross-attention one query group of B / J rows for each of the J sources
    (``attnserve.Attention``), no attention output (docs/ARCHITECTURE.md).

    ``greedy``: two more inputs, ``logit_rows`` (R,), the rows whose ``logits`` (R, V) the step computes, and
    ``token_rows``, those whose greedy next token it computes instead, ``tokens``. Without it (what the int8
    variant is quantized from), every row's logits."""
    L = c.n_decoder_layers
    g = Graph(c, w, fast_decoder_axes(L, greedy))
    names = decoder_inputs(L, fast=True, greedy=greedy)
    _step_inputs(g, names[: names.index("cross_keys.0")])
    cache = _cache_inputs(g, names)
    src_mask = g.op("Cast", "encoder_attention_mask", to=INT32)
    lengths = g.op("Cast", g.op("Gather", "position_ids", g.const(0), axis=1), to=INT32)  # (B,)
    longest = g.op("Add", g.op("ReduceMax", "position_ids", keepdims=0), g.const(1))
    total = g.op("Reshape", g.op("Cast", longest, to=INT32), g.const([1]))  # (1,)
    x = embed(g, "input_ids", "position_ids", "tgt")  # (B, 1, d_model)
    for l in range(L):
        p = f"decoder_layers.{l}"

        def self_attention(y: str, p: str = p, l: int = l) -> tuple[str, None]:
            q, k, v = (linear(g, y, f"{p}.self_attn.{m}") for m in ("W_Q", "W_K", "W_V"))
            out, _, _ = g.custom(
                "CachedAttention",
                q,
                k,
                v,
                cache[f"past_keys.{l}"],
                cache[f"past_values.{l}"],
                lengths,
                total,
                outputs=[f"{p}.self", f"present_keys.{l}", f"present_values.{l}"],
            )
            return linear(g, out, f"{p}.self_attn.W_O"), None

        def cross_attention(y: str, p: str = p, l: int = l) -> tuple[str, None]:
            sources = g.op("Shape", cache[f"cross_keys.{l}"], start=0, end=1)  # J
            q = g.op("Reshape", linear(g, y, f"{p}.src_attn.W_Q"),
                     g.op("Concat", sources, g.const([-1, c.d_model]), axis=0))  # (J, B / J, d_model)  # fmt: skip
            out = g.custom("Attention", q, cache[f"cross_keys.{l}"], cache[f"cross_values.{l}"], src_mask)
            return linear(g, g.op("Reshape", out, g.const([-1, 1, c.d_model])), f"{p}.src_attn.W_O"), None

        x, _ = sublayer(g, x, f"{p}.sublayer.0", self_attention)
        x, _ = sublayer(g, x, f"{p}.sublayer.1", cross_attention)
        x = feed_forward_sublayer(g, x, p, 2)
    hidden = last_position(g, final_norm(g, x, "decoder"))  # (B, d_model)
    if greedy:  # the logit rows from the projection's panels: no transposed copy of it beside the embedding's rows
        logits = g.custom("Logits", g.op("Gather", hidden, "logit_rows", axis=0), *projection(g))
        g.output(logits, "logits", FLOAT, [None, c.vocab_size])
        g.output(greedy_tokens(g, g.op("Gather", hidden, "token_rows", axis=0)), "tokens", INT64, [None])
    else:
        g.output(generator(g, hidden), "logits", FLOAT, [None, c.vocab_size])
    for kind in ("keys", "values"):
        for l in range(L):
            g.output(f"present_{kind}.{l}", f"present_{kind}.{l}", FLOAT, _cache_dims(c))
    return g.model("fast_decoder")


def device_decoder(c: TransformerConfig, w: Weights, float16: bool = False) -> onnx.ModelProto:
    """decoder.device.onnx: decoder.onnx's step in standard operators only, without attention outputs, the caches
    reordered and shared inside it, then the selection tail (:mod:`~model.export.selection`).

    ``parent_rows`` (B,): row b continues past row ``parent_rows[b]``'s hypothesis and gathers its past keys and
    values. ``source_rows`` (B,): the row of the cross keys, values and ``encoder_attention_mask`` that row b reads.
    No ``self_attention_mask``: row b owns the last ``position_ids[b]`` slots of the past caches and the new one.
    ``float16``: weights, arithmetic, caches and cache inputs and outputs in float16 (ONNX Runtime's converter), the
    selection tail in float32."""
    L = c.n_decoder_layers
    g = Graph(c, w, device_decoder_axes(L))
    names = device_decoder_inputs(L, selection=False)
    _step_inputs(g, names[: names.index("cross_keys.0")])
    cache = _cache_inputs(g, names)

    def rows(kind: str, index: str) -> list[str]:
        return [g.op("Gather", cache[f"{kind}.{l}"], index, axis=0) for l in range(L)]

    cross = list(zip(rows("cross_keys", "source_rows"), rows("cross_values", "source_rows"), strict=True))
    past = list(zip(rows("past_keys", "parent_rows"), rows("past_values", "parent_rows"), strict=True))
    T = g.op("Gather", g.op("Shape", cache["past_keys.0"]), g.const(2))
    slots = g.op("Unsqueeze", g.op("Range", g.const(0), g.op("Add", T, g.const(1)), g.const(1)), g.const([0]))
    owned = g.op("GreaterOrEqual", slots, g.op("Sub", T, "position_ids"))  # (B, T + 1)
    src_mask = padding_mask(g, g.op("Gather", "encoder_attention_mask", "source_rows", axis=0))
    x, present, _, _ = _decoder_stack(g, "input_ids", "position_ids", cross, src_mask,
                                      g.op("Unsqueeze", owned, g.const([1, 2])), past)  # fmt: skip
    g.output(generator(g, last_position(g, x)), "logits", FLOAT, [None, c.vocab_size])
    _present_outputs(g, present)
    graph = g.model("device_decoder")
    if float16:
        import warnings

        from onnxruntime.transformers.float16 import convert_float_to_float16

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values out of float16 range were clamped": the masks' lowest float
            graph = convert_float_to_float16(graph, keep_io_types=False)
    append_selection(graph, c.vocab_size, c.pad_id)
    return graph
