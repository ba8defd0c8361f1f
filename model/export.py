"""Write a bundle: the model as ONNX graphs (an encoder and a decoder step with every attention as an output, and
a fast decoder step for /translate), its tokenizer and a manifest.

The bundle layout and graph signatures are the contract in docs/ARCHITECTURE.md. Exporting checks ONNX Runtime
against PyTorch before anything is written, and refuses to overwrite a bundle without ``force``.

The weights travel inside the graphs: ONNX initializers keep the PyTorch state-dict names (the graphs are
exported without constant folding; ONNX Runtime folds at load time), so :func:`load_state_dict` reads them back
exactly — what ``attnserve export-marian`` needs — and no separate weights file makes the bundle heavier.

The fast decoder (:class:`FastDecoderGraph`) writes its caches in place and has no attention outputs; its float32
weights are a second copy. :func:`add_int8` adds the quantized variant for /translate: the encoder and the fast
decoder. :func:`add_float16` adds a float16 variant for GPUs.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import Tensor, nn

from model.transformer import KV, Transformer, TransformerConfig, attention, padding_mask, segment_mask
from service.bundle import FORMAT, sha256

log = logging.getLogger(__name__)

OPSET = 17
SOURCES = "sources"  # the fast decoder's cross caches' and encoder mask's first axis: B / G sources of G rows each
TOLERANCE = 1e-4
# float16 keeps 11 significant bits: attention scores of tens round by hundredths and move a softmax weight by a few
# hundredths (the shipped model: 0.001 at worst; a random test model: 0.05); a broken conversion is off by far more.
FLOAT16_TOLERANCE = 0.1
GRAPHS = ("encoder.onnx", "decoder.onnx")


class EncoderGraph(nn.Module):
    """encoder.onnx: (input_ids, attention_mask, position_ids) -> encoder_attentions, then per decoder layer its
    cross keys and values (the encoder output projected by that layer's encoder-decoder attention).

    attention_mask holds segment numbers (:func:`~model.transformer.segment_mask`): 0 for padding, 1 for a row of one
    text, 1, 2, ... for the texts packed into one row, each with its own position_ids from 0.
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> tuple[Tensor, ...]:
        memory, weights = self.model.encode(input_ids, segment_mask(attention_mask), position_ids)
        memory_kv = self.model.memory_kv(memory)
        return (
            torch.stack(weights),  # (L_enc, B, h, S, S)
            *(k for k, _ in memory_kv),  # L_dec × (B, h, S, d_k)
            *(v for _, v in memory_kv),
        )


def split_cache(cache: tuple[Tensor, ...], L: int) -> tuple[tuple[Tensor, ...], ...]:
    """The decoder graphs' cache inputs, in order: L cross keys, L cross values, L past keys, L past values."""
    return tuple(cache[i * L : (i + 1) * L] for i in range(4))


class DecoderGraph(nn.Module):
    """decoder.onnx: one decoding step on the key/value cache; see docs/ARCHITECTURE.md for the signature.

    Each layer's cache is its own input and output (``past_keys.{l}``, ``present_keys.{l}``, ...): stacking the
    layers into one tensor made ONNX Runtime copy the whole cache twice more every step (Split and Concat).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,  # (B, 1)
        position_ids: Tensor,  # (B, 1)
        encoder_attention_mask: Tensor,  # (B, S)
        self_attention_mask: Tensor,  # (B, T + 1): 0 for cache slots of a shorter sequence
        *cache: Tensor,  # L cross keys, L cross values (B, h, S, d_k); L past keys, L past values (B, h, T, d_k)
    ) -> tuple[Tensor, ...]:
        L = self.model.config.n_decoder_layers
        cross_keys, cross_values, past_keys, past_values = split_cache(cache, L)
        x, present, self_w, cross_w = self.model.decode(
            input_ids,
            position_ids,
            list(zip(cross_keys, cross_values, strict=True)),
            padding_mask(encoder_attention_mask),
            padding_mask(self_attention_mask),
            list(zip(past_keys, past_values, strict=True)),
        )
        logits = self.model.generator(x[:, -1])  # (B, V)
        return (
            logits,
            *(k for k, _ in present),  # L × (B, h, T + 1, d_k)
            *(v for _, v in present),
            torch.stack(self_w)[:, :, :, 0],  # (L, B, h, T + 1)
            torch.stack(cross_w)[:, :, :, 0],  # (L, B, h, S)
        )


class FusedAttention(torch.autograd.Function):
    """Attention of queries (B, T_q, d_model), before the heads are split, on projected keys and values
    (B, h, T_k, d_k) under a key mask int32 (B, T_k) -> (B, T_q, d_model), heads concatenated.

    In PyTorch it is :func:`~model.transformer.attention`; exported, it is one node, ``attnserve.Attention``:
    attnserve's kernel (service/_attention.c) instead of a dozen nodes per attention, or ONNX Runtime's
    ``com.microsoft.MultiHeadAttention`` (:func:`attention_kernels`).
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, K: Tensor, V: Tensor, mask: Tensor) -> Tensor:
        B, T_q, _ = q.shape
        h, d_k = K.shape[1], K.shape[3]
        out, _ = attention(q.view(B, T_q, h, d_k).transpose(1, 2), K, V, (mask != 0)[:, None, None, :])
        return out.transpose(1, 2).reshape(B, T_q, h * d_k)

    @staticmethod
    def symbolic(g: Any, q: Any, K: Any, V: Any, mask: Any) -> Any:
        out = g.op(f"{KERNELS}::Attention", q, K, V, mask)
        out.setType(q.type())
        return out


class SegmentAttention(torch.autograd.Function):
    """The encoder's self-attention of projected queries, keys and values (B, S, d_model), heads side by side, under
    segment numbers (B, S) (:class:`EncoderGraph`'s attention_mask as int32) -> (B, S, d_model), heads concatenated:
    a token attends to its own text's tokens (:func:`~model.transformer.segment_mask`).

    Exported, it is one node, ``attnserve.SegmentAttention`` (service/_attention.c), with h as its last input."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, segments: Tensor, h: int) -> Tensor:
        B, S, d_model = q.shape

        def heads(x: Tensor) -> Tensor:
            return x.view(B, S, h, d_model // h).transpose(1, 2)  # (B, h, S, d_k)

        out, _ = attention(heads(q), heads(k), heads(v), segment_mask(segments))
        return out.transpose(1, 2).reshape(B, S, d_model)

    @staticmethod
    def symbolic(g: Any, q: Any, k: Any, v: Any, segments: Any, h: int) -> Any:
        out = g.op(f"{KERNELS}::SegmentAttention", q, k, v, segments, g.op("Constant", value_t=torch.tensor(h)))
        out.setType(q.type())
        return out


class FastEncoderGraph(nn.Module):
    """The fast encoder for /translate (what :func:`add_int8` quantizes; /attention keeps :class:`EncoderGraph`):
    the same inputs and cross keys and values, with each self-attention one :class:`SegmentAttention` node and no
    attention output."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> tuple[Tensor, ...]:
        m = self.model
        segments = attention_mask.to(torch.int32)  # (B, S)
        x = m.src_embed(input_ids, position_ids)  # (B, S, d_model)
        for layer in m.encoder_layers:
            x = self.layer(layer, x, segments)
        memory_kv = m.memory_kv(m.encoder_norm(x))
        return (*(k for k, _ in memory_kv), *(v for _, v in memory_kv))  # L_dec × (B, h, S, d_k) each

    @staticmethod
    def layer(layer: Any, x: Tensor, segments: Tensor) -> Tensor:
        """:class:`~model.transformer.EncoderLayer`'s two sub-layers with :class:`SegmentAttention`."""
        attn = layer.self_attn

        def self_attention(y: Tensor) -> tuple[Tensor, None]:
            return attn.W_O(SegmentAttention.apply(attn.W_Q(y), attn.W_K(y), attn.W_V(y), segments, attn.h)), None

        x, _ = layer.sublayer[0](x, self_attention)
        x, _ = layer.sublayer[1](x, lambda y: (layer.feed_forward(y), None))
        return x


KERNELS = "attnserve"  # the domain of attnserve's own ONNX Runtime kernels (service/_attention.c)


class CachedAttention(torch.autograd.Function):
    """One step's masked self-attention on a cache where each row's tokens sit at its start: row b's query
    (B, 1, d_model) with its new key and value (B, 1, d_model) written at slot ``lengths[b]`` of the caches
    (B, h, C, d_k), attending to slots ``0..lengths[b]`` -> (B, 1, d_model), and the caches with the new slots.

    In PyTorch it is :func:`~model.transformer.attention` under a key mask; exported, one node,
    ``attnserve.CachedAttention`` (``lengths`` int32 (B,), ``total`` int32 (1,) the longest row's slots): attnserve's
    kernel, or ONNX Runtime's ``com.microsoft.GroupQueryAttention`` with as many key/value heads as query heads
    (:func:`attention_kernels`). Either writes the new slots in place when the caches are bound as both input and
    output, and attends over each row's own length only: no copy of the cache a step and no work for a shorter
    row's padding.
    """

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, K: Tensor, V: Tensor, lengths: Tensor, total: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        B, h, C, d_k = K.shape
        rows, at = torch.arange(B), lengths.long()
        K, V = K.clone(), V.clone()
        K[rows, :, at] = k.reshape(B, h, d_k)
        V[rows, :, at] = v.reshape(B, h, d_k)
        mask = torch.arange(C)[None] <= at[:, None]  # (B, C)
        out, _ = attention(q.reshape(B, 1, h, d_k).transpose(1, 2), K, V, mask[:, None, None, :])
        return out.transpose(1, 2).reshape(B, 1, h * d_k), K, V

    @staticmethod
    def symbolic(g: Any, q: Any, k: Any, v: Any, K: Any, V: Any, lengths: Any, total: Any) -> Any:
        out, K_out, V_out = g.op(f"{KERNELS}::CachedAttention", q, k, v, K, V, lengths, total, outputs=3)
        out.setType(q.type())
        K_out.setType(K.type())
        V_out.setType(V.type())
        return out, K_out, V_out


def screen_weights(W: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The projection W (V, d_model) as :class:`GreedyTokens` screens with it: quantized to 7-bit integers (int8 from
    -63 to 63, nearest, scaled by W's largest magnitude / 63: see service/_attention.c), transposed (d_model, V) for
    MatMulInteger; the scale (); the largest L1 norm of W's rows ()."""
    W = W.detach().float()
    scale = W.abs().max() / 63
    quantized = torch.round(W / torch.where(scale > 0, scale, 1)).clamp(-63, 63).to(torch.int8)
    return quantized.T.contiguous(), scale, W.double().abs().sum(dim=1).max().float()


class GreedyTokens(torch.autograd.Function):
    """Greedy search's next tokens: rows h (T, d_model) through the projection W (V, d_model) and its bias (V,; (0,)
    for none) -> (T,) int64, each row's argmax over the vocabulary (the first on ties), ``pad`` left out.

    Exported: h quantized (``DynamicQuantizeLinear``) times W's rows in 7 bits (:func:`screen_weights`,
    ``MatMulInteger``), then ``attnserve.GreedyTokens``, which bounds that product's error, rules out every token
    whose logit cannot be the largest and computes float32 logits for the few left (service/_attention.c): the
    float32 argmax for about a quarter of the projection's work.
    """

    @staticmethod
    def forward(ctx: Any, h: Tensor, W: Tensor, bias: Tensor, W_int8: Tensor, w_scale: Tensor, w_l1: Tensor,
                pad: Tensor) -> Tensor:  # fmt: skip
        logits = h @ W.T + bias if len(bias) else h @ W.T
        return torch.where(torch.arange(len(W)) == pad, -torch.inf, logits).argmax(-1)

    @staticmethod
    def symbolic(g: Any, h: Any, W: Any, bias: Any, W_int8: Any, w_scale: Any, w_l1: Any, pad: Any) -> Any:
        quantized, scale, zero = g.op("DynamicQuantizeLinear", h, outputs=3)
        acc = g.op("MatMulInteger", quantized, W_int8, zero)  # (T, V) int32
        out = g.op(f"{KERNELS}::GreedyTokens", acc, scale, h, W, bias, w_scale, w_l1, pad)
        out.setType(h.type().with_dtype(torch.int64).with_sizes([None]))
        return out


class FastDecoderGraph(nn.Module):
    """The fast decoder step that :func:`add_int8` quantizes for /translate (/attention keeps the exact graph):
    :class:`DecoderGraph`'s step with fused attention, without attention outputs, on caches where each row's
    tokens sit at its start (see docs/ARCHITECTURE.md: ``past_keys.{l}`` (B, h, C, d_k) of any capacity C beyond
    the longest row, a row's length is its position). No ``self_attention_mask``; outputs ``logits`` and the
    presents, the caches with this step's slots written (the same buffers when bound as input and output).

    The cross keys and values (and ``encoder_attention_mask``) may hold J = B / G sources: rows gG .. gG + G - 1
    (one beam request's) then share source g's, and cross-attention runs as one query group of G a source instead of
    B single queries (ONNX Runtime's MultiHeadAttention 2.4 times faster at 32 × 4 rows). G = 1 is one a row.

    ``greedy`` (float32's): two more inputs, ``logit_rows`` (R,), the rows whose ``logits`` (R, V) the step
    computes, and ``token_rows`` (T,), those whose greedy next token it computes instead, ``tokens`` (T,) (the argmax
    of the logits, padding left out, through :class:`GreedyTokens`: a quarter of the projection's work): greedy search
    without scores needs no logits. Without it (what the int8 variant quantizes), every row's logits."""

    def __init__(self, model: Transformer, greedy: bool = True) -> None:
        super().__init__()
        self.model = model
        self.greedy = greedy
        c = model.config
        if greedy:
            self.register_buffer("pad_id", torch.tensor(c.pad_id))
            W = model.generator.proj.weight.detach()
            bias = model.generator.final_logits_bias
            self.register_buffer("logits_bias", torch.zeros(0) if bias is None else bias.detach().clone())  # (0,): none
            for name, value in zip(("projection_int8", "projection_scale", "projection_l1"), screen_weights(W),
                                   strict=True):  # fmt: skip
                self.register_buffer(name, value)

    def forward(
        self,
        input_ids: Tensor,  # (B, 1)
        position_ids: Tensor,  # (B, 1): tokens each row has cached
        encoder_attention_mask: Tensor,  # (B, S)
        *rest: Tensor,  # greedy: logit_rows (R,), token_rows (T,); then L cross keys, L cross values (B, h, S, d_k),
        # L past keys, L past values (B, h, C, d_k)
    ) -> tuple[Tensor, ...]:
        m = self.model
        L = m.config.n_decoder_layers
        rows, cache = (rest[:2], rest[2:]) if self.greedy else ((), rest)
        cross_keys, cross_values, past_keys, past_values = split_cache(cache, L)
        src_mask = encoder_attention_mask.to(torch.int32)
        lengths = position_ids[:, 0].to(torch.int32)  # (B,)
        total = (position_ids.max() + 1).to(torch.int32).reshape(1)
        x = m.tgt_embed(input_ids, position_ids)  # (B, 1, d_model)
        present = []
        for l, layer in enumerate(m.decoder_layers):
            memory_kv, past = (cross_keys[l], cross_values[l]), (past_keys[l], past_values[l])
            x, kv = self.layer(layer, x, memory_kv, src_mask, past, lengths, total)
            present.append(kv)
        hidden = m.decoder_norm(x)[:, -1]  # (B, d_model)
        presents = (*(k for k, _ in present), *(v for _, v in present))
        if not self.greedy:
            return (m.generator(hidden), *presents)  # (B, V)
        logit_rows, token_rows = rows
        screen = (self.logits_bias, self.projection_int8, self.projection_scale, self.projection_l1, self.pad_id)
        tokens = GreedyTokens.apply(hidden[token_rows], m.generator.proj.weight, *screen)  # (T,)
        return (m.generator(hidden[logit_rows]), tokens, *presents)  # (R, V), (T,)

    @staticmethod
    def layer(layer: Any, x: Tensor, memory_kv: KV, src_mask: Tensor, past: KV, lengths: Tensor, total: Tensor
              ) -> tuple[Tensor, KV]:  # fmt: skip
        """:class:`~model.transformer.DecoderLayer`'s three sub-layers with :class:`CachedAttention` and
        :class:`FusedAttention`."""
        self_attn, src_attn = layer.self_attn, layer.src_attn

        def masked_self_attention(y: Tensor) -> tuple[Tensor, KV]:
            q, k, v = self_attn.W_Q(y), self_attn.W_K(y), self_attn.W_V(y)  # (B, 1, d_model)
            out, K, V = CachedAttention.apply(q, k, v, *past, lengths, total)
            return self_attn.W_O(out), (K, V)

        def cross_attention(y: Tensor) -> tuple[Tensor, None]:
            B, _, d_model = y.shape
            J = memory_kv[0].shape[0]  # sources: B / J consecutive rows (one beam request's) share each one's keys
            q = src_attn.W_Q(y).reshape(J, -1, d_model)  # (J, B / J, d_model): one query group a source
            return src_attn.W_O(FusedAttention.apply(q, *memory_kv, src_mask).reshape(B, 1, d_model)), None

        x, present = layer.sublayer[0](x, masked_self_attention)
        x, _ = layer.sublayer[1](x, cross_attention)
        x, _ = layer.sublayer[2](x, lambda y: (layer.feed_forward(y), None))
        return x, present


ONNXRUNTIME = {"Attention": "MultiHeadAttention", "CachedAttention": "GroupQueryAttention"}  # com.microsoft's
OURS = {theirs: ours for ours, theirs in ONNXRUNTIME.items()}
Kernels = Literal["attnserve", "onnxruntime"]


def attention_kernels(path: Path, h: int, kernels: Kernels) -> None:
    """Whose kernels a graph's attention nodes run, in place: attnserve's (domain ``attnserve``, service/_attention.c:
    :class:`FusedAttention` as ``Attention``, :class:`CachedAttention` as ``CachedAttention``, as exported) or ONNX
    Runtime's (``com.microsoft`` MultiHeadAttention with no bias, GroupQueryAttention with h key/value heads: the form
    that ONNX Runtime's quantizer can load, without attnserve's library). Either form converts to the other; the
    graph imports only the domains its nodes use."""
    graph = onnx.load(str(path))
    for node in graph.graph.node:
        if node.domain == KERNELS and node.op_type in ONNXRUNTIME:
            name = node.op_type
        elif node.domain == "com.microsoft" and node.op_type in OURS:
            name = OURS[node.op_type]
        else:
            continue
        inputs = list(node.input)
        if name == "Attention":  # (q, K, V, mask); MultiHeadAttention's are (q, K, V, bias, mask)
            inputs = [*inputs[:3], inputs[-1]] if kernels == "attnserve" else [*inputs[:3], "", inputs[-1]]
        del node.input[:], node.attribute[:]
        node.input.extend(inputs)  # CachedAttention's are GroupQueryAttention's first seven
        if kernels == "attnserve":
            node.domain, node.op_type = KERNELS, name
        else:
            node.domain, node.op_type = "com.microsoft", ONNXRUNTIME[name]
            heads = ("num_heads", "kv_num_heads") if name == "CachedAttention" else ("num_heads",)
            node.attribute.extend(onnx.helper.make_attribute(a, h) for a in heads)
    used = {node.domain for node in graph.graph.node}
    # ONNX's own domain, and any other that a node uses (ONNX Runtime's optimized graphs import a dozen more)
    others = used - {KERNELS, "com.microsoft"}
    imports = [o for o in graph.opset_import if o.domain in ("", "ai.onnx") or o.domain in others]
    del graph.opset_import[:]
    graph.opset_import.extend(
        [*imports, *(onnx.helper.make_opsetid(d, 1) for d in (KERNELS, "com.microsoft") if d in used)]
    )
    onnx.save(graph, str(path))


ENCODER_INPUTS = ["input_ids", "attention_mask", "position_ids"]


def encoder_outputs(L: int, fast: bool = False) -> list[str]:
    """encoder.onnx's (``fast``: :class:`FastEncoderGraph`'s, without attentions) output names for L decoder layers,
    in the graph module's order."""
    cross = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values") for l in range(L)]
    return cross if fast else ["encoder_attentions", *cross]


def _encoder_axes(L: int) -> dict[str, dict[int, str]]:
    B, S = "batch", "source_length"
    return {
        **{name: {0: B, 1: S} for name in ENCODER_INPUTS},
        "encoder_attentions": {1: B, 3: S, 4: S},
        **{f"cross_{kind}.{l}": {0: B, 2: S} for kind in ("keys", "values") for l in range(L)},
    }


def decoder_inputs(L: int, fast: bool = False, greedy: bool = False) -> list[str]:
    """decoder.onnx's (or the fast decoder's: no self-attention mask; ``greedy``, the rows of logits and of tokens)
    input names for L layers, in the graph module's order."""
    cache = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values", "past_keys", "past_values") for l in range(L)]
    rows = ["logit_rows", "token_rows"] if greedy else [] if fast else ["self_attention_mask"]
    return ["input_ids", "position_ids", "encoder_attention_mask", *rows, *cache]


def decoder_outputs(L: int, fast: bool = False, greedy: bool = False) -> list[str]:
    """decoder.onnx's (or decoder.fast.onnx's, ``greedy``: with tokens) output names for L layers, in the graph
    module's order."""
    present = [f"{kind}.{l}" for kind in ("present_keys", "present_values") for l in range(L)]
    if fast:
        return ["logits", *(["tokens"] if greedy else []), *present]
    return ["logits", *present, "self_attentions", "cross_attentions"]


def decoder_feed(step: dict[str, np.ndarray], cross: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """A decoder.onnx feed from example_inputs' step (past stacked over layers) and the encoder's cross outputs."""
    L = len(cross) // 2
    feed = {k: v for k, v in step.items() if k not in ("past_keys", "past_values")}
    for l in range(L):
        feed[f"cross_keys.{l}"], feed[f"cross_values.{l}"] = cross[l], cross[L + l]
        feed[f"past_keys.{l}"], feed[f"past_values.{l}"] = step["past_keys"][l], step["past_values"][l]
    return feed


def example_inputs(c: TransformerConfig, B: int = 3, S: int = 7, T: int = 4, seed: int = 0) -> dict[str, Any]:
    """A padded batch of different source lengths, its last row two texts packed (S ≥ 6), and a decoder step with a
    partly masked cache (numpy, int64)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(S, 2, B).astype(np.int64)  # the first sequence is the longest
    lengths[-1] = 5  # the last row: texts of 3 and 2 tokens
    input_ids = rng.integers(2, c.vocab_size - 1, size=(B, S)).astype(np.int64)
    mask = (np.arange(S)[None] < lengths[:, None]).astype(np.int64)
    input_ids = np.where(mask == 1, input_ids, c.pad_id)
    input_ids[np.arange(B), lengths - 1] = c.eos_id
    segments, positions = mask.copy(), np.broadcast_to(np.arange(S), (B, S)).copy()
    segments[-1, 3:5], positions[-1, 3:5], input_ids[-1, 2] = 2, [0, 1], c.eos_id
    self_mask = np.ones((B, T + 1), dtype=np.int64)
    self_mask[1:, : T // 2] = 0  # later sequences joined the batch late: their first cache slots are padding
    L, h, d_k = c.n_decoder_layers, c.h, c.d_k
    return {
        "encoder": {"input_ids": input_ids, "attention_mask": segments, "position_ids": positions},
        "decoder": {
            "input_ids": rng.integers(2, c.vocab_size - 1, size=(B, 1)).astype(np.int64),
            "position_ids": np.full((B, 1), T, dtype=np.int64),
            "encoder_attention_mask": mask,
            "self_attention_mask": self_mask,
            "past_keys": rng.standard_normal((L, B, h, T, d_k)).astype(np.float32),
            "past_values": rng.standard_normal((L, B, h, T, d_k)).astype(np.float32),
        },
    }


def _export(module: nn.Module, args: tuple[Tensor, ...], path: Path, names: tuple[list[str], list[str]],
            axes: dict[str, dict[int, str]], **extra: Any) -> None:  # fmt: skip
    """TorchScript's exporter (dynamo=False, opset 17), weights as named initializers (no constant folding).

    Why that exporter: it traces the Python control flow away (L layers unrolled), keeps parameter names as
    initializer names, and handles the dynamic batch, source and cache lengths; a zero-length cache works.
    """
    module.eval()  # the exporter restores the wrapper's mode afterwards: a new wrapper would put the model in training
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript exporter deprecation and tracer warnings
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=False,
            dynamo=False,
            **extra,
        )


def _step_example(model: Transformer, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """example_inputs' encoder feed and a decoder feed on the encoder's own cross keys/values (PyTorch's)."""
    ex = example_inputs(model.config, seed=seed)
    with torch.no_grad():
        _, *cross = EncoderGraph(model)(*(torch.from_numpy(ex["encoder"][k]) for k in ENCODER_INPUTS))
    return ex["encoder"], decoder_feed(ex["decoder"], [x.numpy() for x in cross])


def _step_axes(L: int) -> dict[str, dict[int, str]]:
    B, S, T, total = "batch", "source_length", "past_length", "total_length"
    return {
        "input_ids": {0: B},
        "position_ids": {0: B},
        "encoder_attention_mask": {0: B, 1: S},
        "self_attention_mask": {0: B, 1: total},
        **{f"cross_{kind}.{l}": {0: B, 2: S} for kind in ("keys", "values") for l in range(L)},
        **{f"past_{kind}.{l}": {0: B, 2: T} for kind in ("keys", "values") for l in range(L)},
        "logits": {0: B},
        **{f"present_{kind}.{l}": {0: B, 2: total} for kind in ("keys", "values") for l in range(L)},
    }


def export_graphs(model: Transformer, out_dir: Path) -> None:
    """Export encoder.onnx and decoder.onnx (every attention an output)."""
    model = model.eval()
    L = model.config.n_decoder_layers
    enc_feed, dec_feed = _step_example(model)
    B, S = "batch", "source_length"
    _export(
        EncoderGraph(model),
        tuple(torch.from_numpy(enc_feed[k]) for k in ENCODER_INPUTS),
        out_dir / "encoder.onnx",
        (ENCODER_INPUTS, encoder_outputs(L)),
        _encoder_axes(L),
    )
    _export(
        DecoderGraph(model),
        tuple(torch.from_numpy(dec_feed[k]) for k in decoder_inputs(L)),
        out_dir / "decoder.onnx",
        (decoder_inputs(L), decoder_outputs(L)),
        {**_step_axes(L), "self_attentions": {1: B, 3: "total_length"}, "cross_attentions": {1: B, 3: S}},
    )


def fast_example(
    model: Transformer, seed: int = 0, greedy: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A fast decoder feed (each row's cached tokens at its start, rows of 4, 2 and 0 tokens in caches of 6 slots;
    ``greedy``: every row's logits and greedy token asked for) and the same step as a decoder.onnx feed (each row's
    tokens at the end of a cache of 4, the rest masked)."""
    c = model.config
    _, exact = _step_example(model, seed)
    B, h, T, d_k = exact["past_keys.0"].shape
    lengths = np.array([T, T // 2, 0])[:B]
    exact["position_ids"] = lengths[:, None].astype(np.int64)
    exact["self_attention_mask"] = (np.arange(T + 1)[None] >= (T - lengths)[:, None]).astype(np.int64)
    fast = {k: v for k, v in exact.items() if k != "self_attention_mask"}
    if greedy:
        fast["logit_rows"] = fast["token_rows"] = np.arange(B)
    rng = np.random.default_rng(seed)
    for name in (f"past_{kind}.{l}" for kind in ("keys", "values") for l in range(c.n_decoder_layers)):
        buffer = rng.standard_normal((B, h, T + 2, d_k)).astype(np.float32)  # stale slots: never attended to
        for b, n in enumerate(lengths):
            buffer[b, :, :n] = exact[name][b, :, T - n :]
        fast[name] = buffer
    return fast, exact


def kernel_session(path: Path, optimized: Path | None = None) -> Any:
    """An ONNX Runtime session (CPU) of the graph at ``path`` with attnserve's kernels registered, as the runner makes
    them; ``optimized``: where to write the graph after ONNX Runtime's basic optimizations (weight transposes folded
    into initializers), what the quantizer needs."""
    import onnxruntime as ort

    from service.runner import attention_library

    opts = ort.SessionOptions()
    opts.register_custom_ops_library(attention_library())
    if optimized is not None:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def export_fast_decoder(
    model: Transformer, path: Path, tolerance: float = TOLERANCE, kernels: Kernels = "attnserve"
) -> float:
    """Export :class:`FastDecoderGraph` with fused attention (``kernels``: :func:`attention_kernels`) to ``path`` and
    check it (run as the runner runs it, its caches bound as input and output) against PyTorch's exact step on the
    same tokens: logits, and each row's cache slots, within ``tolerance``, and greedy tokens whose logits are the
    largest within it. Returns the largest difference seen.

    With attnserve's kernels it is the greedy form (``greedy``: logits or tokens by row); ONNX Runtime's form (what
    the int8 variant's quantizer loads, which cannot hold attnserve's kernels) gives every row's logits."""
    import onnxruntime as ort

    model = model.eval()
    L = model.config.n_decoder_layers
    greedy = kernels == "attnserve"
    names, outputs = decoder_inputs(L, fast=True, greedy=greedy), decoder_outputs(L, fast=True, greedy=greedy)
    feed, _ = fast_example(model, greedy=greedy)
    axes = {k: v for k, v in _step_axes(L).items() if k != "self_attention_mask"}
    for name in ("encoder_attention_mask", *(f"cross_{kind}.{l}" for kind in ("keys", "values") for l in range(L))):
        axes[name] = {**axes[name], 0: SOURCES}  # B / G sources, G rows each (docs/ARCHITECTURE.md)
    axes.update({f"{kind}.{l}": {0: "batch", 2: "capacity"} for kind in ("past_keys", "past_values", "present_keys",
                 "present_values") for l in range(L)})  # fmt: skip
    if greedy:
        axes.update({"logit_rows": {0: "logit_rows"}, "logits": {0: "logit_rows"}, "token_rows": {0: "token_rows"},
                     "tokens": {0: "token_rows"}})  # fmt: skip
    _export(
        FastDecoderGraph(model, greedy),
        tuple(torch.from_numpy(feed[k]) for k in names),
        path,
        (names, outputs),
        axes,
        custom_opsets={KERNELS: 1},
    )
    attention_kernels(path, model.config.h, kernels)
    feed, exact = fast_example(model, seed=1, greedy=greedy)
    session = kernel_session(path)
    binding = session.io_binding()
    presents = [name for name in outputs if name.startswith("present_")]
    for name in outputs[: -len(presents)]:
        binding.bind_output(name, "cpu")
    for name in names:
        value = ort.OrtValue.ortvalue_from_numpy(feed[name])
        binding.bind_ortvalue_input(name, value)
        if name.startswith("past_"):
            binding.bind_ortvalue_output(name.replace("past_", "present_"), value)  # in place, as the runner does
    session.run_with_iobinding(binding)
    with torch.no_grad():
        want = DecoderGraph(model)(*(torch.from_numpy(exact[k]) for k in decoder_inputs(L)))
    logits = binding.get_outputs()[0].numpy()
    if greedy:  # every row's logits and tokens were asked for
        tokens = binding.get_outputs()[1].numpy()
        allowed = want[0].numpy().copy()  # (B, V)
        allowed[:, model.config.pad_id] = -np.inf
        chosen = allowed[np.arange(len(tokens)), tokens]
        scale = np.maximum(1.0, np.abs(allowed).max(axis=1, where=np.isfinite(allowed), initial=0))
        if not ((allowed.max(axis=1) - chosen) / scale <= tolerance).all():
            raise ValueError(f"ONNX Runtime's greedy tokens {tokens.tolist()} are not PyTorch's argmax")
    lengths = exact["position_ids"][:, 0] + 1  # each row's slots after the step
    T = exact["past_keys.0"].shape[2]
    got, ragged = [logits], [want[0]]
    for i, name in enumerate(presents):
        buffer = feed[name.replace("present_", "past_")]
        got += [buffer[b, :, :n] for b, n in enumerate(lengths)]
        ragged += [want[1 + i][b, :, T + 1 - n :] for b, n in enumerate(lengths)]
    return _compare(["logits"] + [f"cache slots of row {b}" for b in range(len(got) - 1)], got, ragged, tolerance)


def export_fast_encoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Export :class:`FastEncoderGraph` to ``path`` and check its cross keys and values against PyTorch's exact
    encoder (:class:`EncoderGraph`) on a padded batch with two texts packed in a row, within ``tolerance``.
    Returns the largest difference seen."""
    model = model.eval()
    L = model.config.n_decoder_layers
    feed = example_inputs(model.config)["encoder"]
    outputs = encoder_outputs(L, fast=True)
    _export(
        FastEncoderGraph(model),
        tuple(torch.from_numpy(feed[k]) for k in ENCODER_INPUTS),
        path,
        (ENCODER_INPUTS, outputs),
        {k: v for k, v in _encoder_axes(L).items() if k in ENCODER_INPUTS + outputs},
        custom_opsets={KERNELS: 1},
    )
    feed = example_inputs(model.config, seed=1)["encoder"]
    got = kernel_session(path).run(outputs, feed)
    with torch.no_grad():
        _, *want = EncoderGraph(model)(*(torch.from_numpy(feed[k]) for k in ENCODER_INPUTS))
    return _compare(outputs, got, want, tolerance)


def _compare(names: list[str], got: Sequence[np.ndarray], want: Sequence[Tensor], tolerance: float) -> float:
    """The largest difference of any output, relative to the output's magnitude where that exceeds 1 (float32 sums
    of values near 10 differ by about 1e-5 · 10 between GEMM kernels); raises past ``tolerance``."""
    worst = 0.0
    for name, a, tensor in zip(names, got, want, strict=False):  # want may have more outputs (attention weights)
        b = tensor.numpy()
        scale = max(1.0, float(np.abs(b).max()))
        diff = float(np.abs(a - b).max()) / scale
        worst = max(worst, diff)
        if not diff <= tolerance:
            raise ValueError(
                f"ONNX Runtime differs from PyTorch on {name}: max abs {diff * scale:.3g} > {tolerance} × {scale:.3g}"
            )
    return worst


def check_graphs(
    model: Transformer, bundle_dir: Path, tolerance: float = TOLERANCE, graphs: tuple[str, str] = GRAPHS
) -> float:
    """Run both graphs (``graphs``: the encoder's and the decoder's file) in ONNX Runtime and in PyTorch on a
    padded batch; raise if any output differs by more than ``tolerance`` (max abs, relative to outputs larger than
    1: :func:`_compare`). Returns the largest difference seen."""
    import onnxruntime as ort

    model = model.eval()
    L = model.config.n_decoder_layers
    ex = example_inputs(model.config, seed=1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    enc, dec = (ort.InferenceSession(str(bundle_dir / g), opts, providers=["CPUExecutionProvider"]) for g in graphs)
    enc_ort = enc.run(encoder_outputs(L), ex["encoder"])
    with torch.no_grad():
        enc_pt = EncoderGraph(model)(*(torch.from_numpy(ex["encoder"][k]) for k in ENCODER_INPUTS))
    dec_feed = decoder_feed(ex["decoder"], enc_ort[1:])  # the decoder runs on ONNX Runtime's own cross keys
    dec_ort = dec.run(decoder_outputs(L), dec_feed)
    with torch.no_grad():
        dec_pt = DecoderGraph(model)(*(torch.from_numpy(dec_feed[k]) for k in decoder_inputs(L)))
    return max(
        _compare(encoder_outputs(L), enc_ort, enc_pt, tolerance),
        _compare(decoder_outputs(L), dec_ort, dec_pt, tolerance),
    )


def onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def graph_weights(bundle_dir: Path, graphs: dict[str, str]) -> dict[str, np.ndarray]:
    """The float32 graphs' initializers by state-dict name (the exporter prefixes ``model.``)."""
    found: dict[str, np.ndarray] = {}
    for role in ("encoder", "decoder"):
        for name, array in onnx_initializers(bundle_dir / graphs[role]).items():
            found[name.removeprefix("model.")] = array
    return found


def weight_aliases(model: Transformer, found: dict[str, np.ndarray]) -> dict[str, str]:
    """State-dict names the graphs do not carry -> the initializer that holds the same tensor.

    The exporter keeps one initializer for identical tensors (tied embeddings, LayerNorms still at their
    initial ones and zeros); this map, saved in the manifest, undoes that exactly.

    Raises:
        ValueError: a weight is nowhere in the graphs.
    """
    aliases = {}
    for key, value in model.state_dict().items():
        if key in found:
            continue
        array = value.detach().cpu().numpy()
        twin = next((n for n, a in found.items() if a.shape == array.shape and np.array_equal(a, array)), None)
        if twin is None:
            raise ValueError(f"weight {key} is in neither graph")
        aliases[key] = twin
    return aliases


def load_state_dict(bundle_dir: Path) -> tuple[TransformerConfig, dict[str, Tensor]]:
    """Read a bundle's config and weights back from its float32 graphs (see the module docstring).

    Raises:
        ValueError: a weight is missing (the bundle was not written by :func:`export_bundle`).
    """
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    config = TransformerConfig.from_dict(manifest["model"])
    found = graph_weights(bundle_dir, manifest["graphs"])
    aliases = manifest["weights"]["aliases"]
    state: dict[str, Tensor] = {}
    for key in Transformer(config).state_dict():
        array = found.get(aliases.get(key, key))
        if array is None:
            raise ValueError(f"{bundle_dir}: weight {key} is in neither graph")
        state[key] = torch.from_numpy(array.copy())
    return config, state


def load_model(bundle_dir: Path) -> Transformer:
    """The bundle's PyTorch model, rebuilt from its float32 graphs (:func:`load_state_dict`)."""
    config, state = load_state_dict(bundle_dir)
    model = Transformer(config)
    model.load_state_dict(state)
    return model


_ENCODER = {"role": "encoder"}
_DECODER = {"role": "decoder", "cache": "appended", "grouped_cross": False, "greedy_tokens": False}
_IN_PLACE = {**_DECODER, "cache": "in_place", "grouped_cross": True}
GRAPH_FORMS: dict[str, dict[str, Any]] = {  # graph file -> its manifest graph_forms entry (service/bundle.py)
    "encoder.onnx": {**_ENCODER, "attentions": True},
    "decoder.onnx": {**_DECODER, "attentions": True},
    "decoder.fast.onnx": {**_IN_PLACE, "attentions": False, "greedy_tokens": True},
    "encoder.int8.onnx": {**_ENCODER, "attentions": False},
    "decoder.int8.onnx": {**_IN_PLACE, "attentions": False},
    "encoder.float16.onnx": {**_ENCODER, "attentions": True},
    "decoder.float16.onnx": {**_DECODER, "attentions": True},
}


def write_manifest(bundle_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json with the form of every graph it names and the sha256 of every other file in the bundle."""
    files = sorted(p for p in bundle_dir.iterdir() if p.is_file() and p.name != "manifest.json")
    graphs = [g for v in manifest["graphs"].values() for g in (v.values() if isinstance(v, dict) else [v])]
    manifest = {**manifest, "graph_forms": {g: GRAPH_FORMS[g] for g in graphs}}
    manifest["sha256"] = {p.name: sha256(p) for p in files}
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def export_bundle(
    model: Transformer,
    out_dir: Path,
    *,
    name: str,
    source_lang: str,
    target_lang: str,
    tokenizer: dict[str, Path],
    vocab: dict[str, int] | None = None,
    scores: list[dict[str, Any]] | None = None,
    provenance: dict[str, Any] | None = None,
    force: bool = False,
) -> Path:
    """Export ``model`` and its tokenizer to a bundle directory.

    Args:
        model: the PyTorch model; put in eval mode.
        out_dir: the bundle directory; must not exist (or be empty) unless ``force``.
        tokenizer: ``{"source": spm_path, "target": spm_path}`` — one path twice for a joint model.
        vocab: piece -> id map when the model's ids are not the SentencePiece ids (Marian), else None.
        scores, provenance: recorded in the manifest as they are.
        force: replace an existing bundle.

    Raises:
        FileExistsError: ``out_dir`` holds files and ``force`` is false.
        ValueError: ONNX Runtime disagrees with PyTorch, or the weights cannot be read back exactly.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp_name:
        tmp = Path(tmp_name)
        export_graphs(model, tmp)
        worst_fast = export_fast_decoder(model, tmp / "decoder.fast.onnx")
        graphs = {"encoder": "encoder.onnx", "decoder": "decoder.onnx", "fast_decoder": "decoder.fast.onnx"}
        tok: dict[str, Any] = {"kind": "sentencepiece", "vocab": None}
        for role in ("source", "target"):
            src = tokenizer[role]
            dest = "spm.model" if tokenizer["source"] == tokenizer["target"] else f"{role}.spm"
            shutil.copyfile(src, tmp / dest)
            tok[role] = dest
        if vocab is not None:
            (tmp / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n")
            tok["vocab"] = "vocab.json"
        manifest = {
            "format": FORMAT,
            "name": name,
            "source_lang": source_lang,
            "target_lang": target_lang,
            "model": model.config.to_dict(),
            "tokenizer": tok,
            "graphs": graphs,
            "weights": {
                "source": "float32 graph initializers named as the PyTorch state dict (model/export.py)",
                "aliases": weight_aliases(model, graph_weights(tmp, graphs)),
            },
            "scores": scores or [],
            "provenance": {"exported": _dt.date.today().isoformat(), **(provenance or {})},
        }
        write_manifest(tmp, manifest)
        worst = check_graphs(model, tmp)
        _, state = load_state_dict(tmp)
        for key, value in model.state_dict().items():
            if not torch.equal(state[key], value.detach().cpu()):
                raise ValueError(f"weight {key} does not read back exactly from the graphs")
        log.info("ONNX Runtime matches PyTorch within %.2g (fast decoder %.2g); weights read back exactly", worst,
                 worst_fast)  # fmt: skip
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
        tmp.mkdir()  # the context manager removes it again
    return out_dir


def add_int8(bundle_dir: Path) -> None:
    """Add the ``int8`` variant for /translate: ONNX Runtime dynamic quantization (int8 weights of every MatMul)
    of the fast encoder and of the fast decoder (fused attention, no attention outputs; the decoder's caches
    written in place), rebuilt from the bundle's own weights and checked against PyTorch before they are quantized.

    The graphs are first optimized offline (transposes of weights folded into initializers) so that the
    quantizer sees constant MatMul weights: the encoder with attnserve's kernels registered, the fast decoder
    through ONNX Runtime's attention kernels (quant_pre_process cannot load attnserve's) and back to attnserve's at
    the end. The float32 graphs stay: /attention serves exact weights from them, and they carry the weights for
    ``export-marian``.
    """
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    with tempfile.TemporaryDirectory() as tmp:
        encoder, decoder = Path(tmp) / "encoder.fast.onnx", Path(tmp) / "decoder.fast.onnx"
        log.info("fast encoder matches PyTorch within %.2g", export_fast_encoder(model, encoder))
        worst = export_fast_decoder(model, decoder, kernels="onnxruntime")  # what the quantizer can load
        log.info("fast decoder matches PyTorch within %.2g", worst)
        prepared = {role: Path(tmp) / f"{role}.prepared.onnx" for role in ("encoder", "decoder")}
        kernel_session(encoder, optimized=prepared["encoder"])
        quant_pre_process(decoder, prepared["decoder"], skip_symbolic_shape=True)
        for role, graph in prepared.items():
            quantize_dynamic(graph, bundle_dir / f"{role}.int8.onnx", weight_type=QuantType.QInt8)
        attention_kernels(bundle_dir / "decoder.int8.onnx", model.config.h, "attnserve")
        attention_kernels(bundle_dir / "encoder.int8.onnx", model.config.h, "attnserve")  # imports what it uses
    manifest["graphs"]["int8"] = {role: f"{role}.int8.onnx" for role in ("encoder", "decoder")}
    write_manifest(bundle_dir, manifest)


def add_float16(bundle_dir: Path) -> None:
    """Add the ``float16`` variant, for GPUs: the exact graphs (attention outputs included) with float16 weights
    and arithmetic inside and float32 at their inputs and outputs (ONNX Runtime's converter with
    ``keep_io_types``), so the runner, its caches and /attention need nothing new. Checked against PyTorch in
    ONNX Runtime on the CPU (within FLOAT16_TOLERANCE) before the manifest lists it.

    Raises:
        ValueError: the float16 graphs differ from PyTorch by more than FLOAT16_TOLERANCE.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    variant = {role: f"{role}.float16.onnx" for role in ("encoder", "decoder")}
    for role, name in variant.items():
        graph = onnx.load(str(bundle_dir / manifest["graphs"][role]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values out of float16 range were clamped": the masks' -1e9 and such
            onnx.save(convert_float_to_float16(graph, keep_io_types=True), str(bundle_dir / name))
    worst = check_graphs(model, bundle_dir, FLOAT16_TOLERANCE, (variant["encoder"], variant["decoder"]))
    log.info("float16 graphs match PyTorch within %.2g", worst)
    manifest["graphs"]["float16"] = variant
    write_manifest(bundle_dir, manifest)


ADD_VARIANT = {"int8": add_int8, "float16": add_float16}  # variant name -> what adds it to a bundle


def export_checkpoint(checkpoint: Path, out_dir: Path, force: bool = False) -> Path:
    """``attnserve export CHECKPOINT OUT_DIR``: a checkpoint written by model/train.py to a bundle."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    config = TransformerConfig.from_dict(ckpt["config"])
    model = Transformer(config)
    model.load_state_dict(ckpt["model"])
    meta = ckpt["meta"]
    spm = Path(meta["spm"])
    return export_bundle(
        model,
        out_dir,
        name=meta["name"],
        source_lang=meta["source_lang"],
        target_lang=meta["target_lang"],
        tokenizer={"source": spm, "target": spm},
        provenance=meta.get("provenance"),
        force=force,
    )
