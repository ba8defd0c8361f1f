"""The graph modules that export as ONNX: the exact encoder and decoder step (every attention an output), the fast
encoder and decoder step for /translate on the CPU (fused attention, caches written in place), and the device
decoder step for /translate on CUDA (standard operators, caches reordered inside the step)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from model.export.kernels import CachedAttention, FusedAttention, GreedyTokens, SegmentAttention, screen_weights
from model.transformer import KV, Transformer, causal_mask, padding_mask, segment_mask


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


class DeviceDecoderGraph(nn.Module):
    """decoder.device.onnx's step, before its selection tail (:mod:`~model.export.selection`): :class:`DecoderGraph`'s
    step in standard ONNX operators only (CUDA's and the CPU's), without attention outputs, with the caches
    reordered and shared inside it.

    ``parent_rows`` (B,): row b continues the hypothesis of past row ``parent_rows[b]``, whose past keys and values
    it gathers (a beam step's reordering). ``source_rows`` (B,): the row of the cross keys, values and
    ``encoder_attention_mask`` that row b reads (one per source, shared by its beams). No ``self_attention_mask``:
    row b owns the last ``position_ids[b]`` slots of the past caches (the tokens it generated) and the new one.
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,  # (B, 1)
        position_ids: Tensor,  # (B, 1): tokens each row has generated
        parent_rows: Tensor,  # (B,)
        source_rows: Tensor,  # (B,)
        encoder_attention_mask: Tensor,  # (J, S)
        *cache: Tensor,  # L cross keys, L cross values (J, h, S, d_k); L past keys, L past values (P, h, T, d_k)
    ) -> tuple[Tensor, ...]:
        L = self.model.config.n_decoder_layers
        cross_keys, cross_values, past_keys, past_values = split_cache(cache, L)
        memory_kv = [(k.index_select(0, source_rows), v.index_select(0, source_rows))
                     for k, v in zip(cross_keys, cross_values, strict=True)]  # fmt: skip
        past = [(k.index_select(0, parent_rows), v.index_select(0, parent_rows))
                for k, v in zip(past_keys, past_values, strict=True)]  # fmt: skip
        T = past_keys[0].shape[2]
        owned = torch.arange(T + 1)[None, :] >= T - position_ids  # (B, T + 1)
        src_mask = padding_mask(encoder_attention_mask.index_select(0, source_rows))
        x, present, _, _ = self.model.decode(input_ids, position_ids, memory_kv, src_mask, owned[:, None, None], past)
        return (
            self.model.generator(x[:, -1]),  # (B, V)
            *(k for k, _ in present),  # L × (B, h, T + 1, d_k)
            *(v for _, v in present),
        )


class ForcedDecoderGraph(nn.Module):
    """decoder.forced.onnx: a known target teacher-forced in one call -> its cross-attention at every position.

    ``input_ids`` and ``position_ids`` (B, T) are the decoder's inputs for the target (the start id, then the
    target's tokens but the last); padding after a shorter row's target changes none of its earlier positions (the
    causal mask), so a row's first T_b positions are what stepping through its tokens gives. It takes every layer's
    cross keys but not the last layer's cross values (its weights come before them; nothing after reaches the
    output)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,  # (B, T)
        position_ids: Tensor,  # (B, T)
        encoder_attention_mask: Tensor,  # (B, S)
        *cross: Tensor,  # L cross keys, then L - 1 cross values (B, h, S, d_k): the last layer's reach no output
    ) -> Tensor:
        L = self.model.config.n_decoder_layers
        keys, values = cross[:L], [*cross[L:], cross[L - 1]]  # the last layer's values: any tensor of their shape
        _, _, _, cross_w = self.model.decode(
            input_ids,
            position_ids,
            list(zip(keys, values, strict=True)),
            padding_mask(encoder_attention_mask),
            causal_mask(input_ids.shape[1], input_ids.device),
        )
        return torch.stack(cross_w)  # (L, B, h, T, S)


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


class FastDecoderGraph(nn.Module):
    """The fast decoder step that :func:`add_int8` quantizes for /translate (/attention keeps the exact graph):
    :class:`DecoderGraph`'s step with fused attention, without attention outputs, on caches where each row's
    tokens sit at its start (see docs/ARCHITECTURE.md: ``past_keys.{l}`` (B, h, C, d_k) of any capacity C beyond
    the longest row, a row's length is its position). No ``self_attention_mask``; outputs ``logits`` and the
    presents, the caches with this step's slots written (the same buffers when bound as input and output).

    The cross keys and values (and ``encoder_attention_mask``) may hold J = B / G sources: rows gG .. gG + G - 1
    (one beam request's) then share source g's, and cross-attention runs as one query group of G a source instead of
    B single queries. G = 1 is one a row.

    ``greedy`` (float32's): two more inputs, ``logit_rows`` (R,), the rows whose ``logits`` (R, V) the step
    computes, and ``token_rows`` (T,), those whose greedy next token it computes instead, ``tokens`` (T,) (the argmax
    of the logits, padding left out, through :class:`GreedyTokens`, cheaper than the projection): greedy search
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
            # Shapes from the model's sizes and -1, not from y's: each dimension read from a tensor is a chain of
            # nodes in the exported graph, run at every step.
            d_model = src_attn.W_Q.out_features
            J = memory_kv[0].shape[0]  # sources: B / J consecutive rows (one beam request's) share each one's keys
            q = src_attn.W_Q(y).reshape(J, -1, d_model)  # (J, B / J, d_model): one query group a source
            return src_attn.W_O(FusedAttention.apply(q, *memory_kv, src_mask).reshape(-1, 1, d_model)), None

        x, present = layer.sublayer[0](x, masked_self_attention)
        x, _ = layer.sublayer[1](x, cross_attention)
        x, _ = layer.sublayer[2](x, lambda y: (layer.feed_forward(y), None))
        return x, present
