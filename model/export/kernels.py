"""attnserve's fused attention and greedy-token kernels (service/runtime/_attention.c) as ONNX custom ops: the
autograd functions that export as one node each, the switch between attnserve's and ONNX Runtime's attention nodes,
and ONNX Runtime sessions with attnserve's kernels registered."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from model.transformer import attention, segment_mask

# torch-free, so that the service derives the int8 graphs with them
from service.runtime.kernels import KERNELS as KERNELS
from service.runtime.kernels import Kernels as Kernels
from service.runtime.kernels import attention_kernels as attention_kernels
from service.runtime.kernels import kernel_session as kernel_session


class FusedAttention(torch.autograd.Function):
    """Attention of queries (B, T_q, d_model), before the heads are split, on projected keys and values
    (B, h, T_k, d_k) under a key mask int32 (B, T_k) -> (B, T_q, d_model), heads concatenated.

    In PyTorch it is :func:`~model.transformer.attention`; exported, it is one node, ``attnserve.Attention``:
    attnserve's kernel (service/runtime/_attention.c) instead of a dozen nodes per attention, or ONNX Runtime's
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

    Exported, it is one node, ``attnserve.SegmentAttention`` (service/runtime/_attention.c), with h as its last
    input."""

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
    -63 to 63, nearest, scaled by W's largest magnitude / 63: see service/runtime/_attention.c), transposed (d_model,
    V) for
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
    whose logit cannot be the largest and computes float32 logits for the few left (service/runtime/_attention.c): the
    float32 argmax for a fraction of the projection's work.
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
