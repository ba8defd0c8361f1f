"""The PyTorch reference of the exact graphs (encoder.onnx and decoder.onnx, every attention an output), in their
signatures: what the checks (:mod:`model.export.check`) hold the builder's graphs to."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model.transformer import Transformer, padding_mask, segment_mask


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
