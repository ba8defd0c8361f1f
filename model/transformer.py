"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), read top-down like §3 of the paper.

Every attention returns its weights, because attnserve serves them. With ``activation="swish"`` and a final logits
bias this is exactly Hugging Face's ``MarianMTModel`` (see model/importers/marian.py), so opus-mt checkpoints load into
it.

Shapes: B batch, S source length, T target length, L layers, h heads, d_k = d_model / h, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from model.config import TransformerConfig

KV = tuple[Tensor, Tensor]  # keys and values of one attention, each (B, h, T, d_k)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


# §3.2.1 Scaled dot-product attention ---------------------------------------------------------------------------


def attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """softmax(QKᵀ/√d_k + mask) V.

    Args:
        Q: queries (B, h, T_q, d_k). K, V: keys and values (B, h, T_k, d_k).
        mask: bool, broadcastable to (B, h, T_q, T_k); True where the query may attend to the key.

    Returns:
        The output (B, h, T_q, d_k) and the weights (B, h, T_q, T_k); masked weights are exactly 0.
    """
    d_k = Q.size(-1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, T_q, T_k)
    if mask is not None:
        # The most negative finite number, not -inf: exp() of it is exactly 0, and a row never becomes NaN.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return weights @ V, weights


# §3.2.2 Multi-head attention -----------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The h projections W_i^Q (d_model × d_k) sit side by side in one d_model × d_model matrix W_Q, and so on.
    Keys and values are projected by :meth:`project_kv` apart from the queries, so that a decoder can cache them.
    """

    def __init__(self, d_model: int, h: int) -> None:
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.W_Q = nn.Linear(d_model, d_model)
        self.W_K = nn.Linear(d_model, d_model)
        self.W_V = nn.Linear(d_model, d_model)
        self.W_O = nn.Linear(d_model, d_model)

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def project_kv(self, x: Tensor) -> KV:
        """(B, T, d_model) -> keys and values, each (B, h, T, d_k)."""
        return self.split_heads(self.W_K(x)), self.split_heads(self.W_V(x))

    def forward(self, x: Tensor, K: Tensor, V: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Queries from x (B, T_q, d_model) attend to projected K, V -> (B, T_q, d_model), weights (B, h, T_q, T_k)."""
        Q = self.split_heads(self.W_Q(x))  # (B, h, T_q, d_k)
        out, weights = attention(Q, K, V, mask)  # (B, h, T_q, d_k)
        B, _, T_q, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T_q, self.h * self.d_k)  # Concat(head_1..head_h): (B, T_q, d_model)
        return self.W_O(out), weights


# §3.3 Position-wise feed-forward network -----------------------------------------------------------------------


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2 (the paper's act is ReLU)."""

    def __init__(self, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.act(self.w_1(x)))


# §3.1 Residual connection and layer normalization around each sub-layer ----------------------------------------


class Sublayer(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))) (post-LN, the paper), or x + Dropout(Sublayer(LayerNorm(x))) (pre-LN).

    The sub-layer returns (output, extra); extra (attention weights, a cache) is passed through.
    """

    def __init__(self, d_model: int, dropout: float, normalize_before: bool, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.normalize_before = normalize_before

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], tuple[Tensor, Any]]) -> tuple[Tensor, Any]:
        if self.normalize_before:
            out, extra = sublayer(self.norm(x))
            return x + self.dropout(out), extra
        out, extra = sublayer(x)
        return self.norm(x + self.dropout(out)), extra


# §3.1 Encoder and decoder stacks -------------------------------------------------------------------------------


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation)
        self.sublayer = nn.ModuleList(
            [Sublayer(c.d_model, c.dropout, c.normalize_before, c.layer_norm_eps) for _ in range(2)]
        )

    def forward(self, x: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, S, d_model), src_mask (B, 1, 1 or S, S) -> x, self-attention weights (B, h, S, S)."""

        def self_attention(y: Tensor) -> tuple[Tensor, Tensor]:
            return self.self_attn(y, *self.self_attn.project_kv(y), src_mask)

        x, weights = self.sublayer[0](x, self_attention)
        x, _ = self.sublayer[1](x, lambda y: (self.feed_forward(y), None))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.h)
        self.src_attn = MultiHeadAttention(c.d_model, c.h)
        self.feed_forward = PositionwiseFeedForward(c.d_model, c.d_ff, c.activation)
        self.sublayer = nn.ModuleList(
            [Sublayer(c.d_model, c.dropout, c.normalize_before, c.layer_norm_eps) for _ in range(3)]
        )

    def forward(
        self, x: Tensor, memory_kv: KV, src_mask: Tensor, tgt_mask: Tensor, past: KV | None = None
    ) -> tuple[Tensor, KV, Tensor, Tensor]:
        """One decoder layer over T new target positions that follow T_past cached ones.

        Args:
            x: (B, T, d_model) the new positions (T = 1 when stepping, the whole target when teacher-forcing).
            memory_kv: the encoder output projected by this layer's encoder-decoder attention, each (B, h, S, d_k).
            src_mask: (B, 1, 1, S). tgt_mask: (B, 1, T, T_past + T), True where a position may attend.
            past: keys and values of the T_past earlier positions, each (B, h, T_past, d_k), or None.

        Returns:
            x (B, T, d_model), present keys and values (B, h, T_past + T, d_k), self-attention weights
            (B, h, T, T_past + T) and cross-attention weights (B, h, T, S).
        """

        def masked_self_attention(y: Tensor) -> tuple[Tensor, tuple[KV, Tensor]]:
            K, V = self.self_attn.project_kv(y)
            if past is not None:
                K, V = torch.cat([past[0], K], dim=2), torch.cat([past[1], V], dim=2)  # (B, h, T_past + T, d_k)
            out, weights = self.self_attn(y, K, V, tgt_mask)
            return out, ((K, V), weights)

        x, (present, self_weights) = self.sublayer[0](x, masked_self_attention)
        x, cross_weights = self.sublayer[1](x, lambda y: self.src_attn(y, *memory_kv, src_mask))
        x, _ = self.sublayer[2](x, lambda y: (self.feed_forward(y), None))
        return x, present, self_weights, cross_weights


# §3.4 Embeddings and §3.5 positional encoding ------------------------------------------------------------------


def sinusoids(max_positions: int, d_model: int) -> Tensor:
    """PE(pos, i) = sin(pos / 10000^(2i/d_model)) and cos(...) -> (max_positions, d_model).

    Marian's layout: all sines in the first half of the features, all cosines in the second (the paper interleaves
    them). It is a fixed permutation of the paper's features, so nothing is lost, and opus-mt weights load as they are.
    """
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (ceil(d/2),)
    angles = position * inv_freq  # (P, ceil(d/2))
    half = d_model // 2 + d_model % 2
    pe = torch.zeros(max_positions, d_model, dtype=torch.float64)
    pe[:, :half] = torch.sin(angles)
    pe[:, half:] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


class Embeddings(nn.Module):
    """Token embedding × √d_model (optional) + positional encoding."""

    def __init__(self, c: TransformerConfig, lut: nn.Embedding) -> None:
        super().__init__()
        self.lut = lut
        self.scale = math.sqrt(c.d_model) if c.scale_embedding else 1.0
        # A carried table (position_table="weights") is saved with the weights; the computed one is not.
        carried = c.position_table == "weights"
        self.register_buffer("pe", sinusoids(c.max_positions, c.d_model), persistent=carried)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        """ids, positions (B, T) -> (B, T, d_model)."""
        pe: Tensor = self.pe  # type: ignore[assignment]
        return self.dropout(self.lut(ids) * self.scale + pe[positions])


class Generator(nn.Module):
    """The pre-softmax linear projection to the vocabulary (+ Marian's final logits bias)."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.final_logits_bias:
            self.register_buffer("final_logits_bias", torch.zeros(c.vocab_size))
        else:
            self.final_logits_bias = None

    def forward(self, x: Tensor) -> Tensor:
        logits = self.proj(x)  # (B, T, V)
        return logits if self.final_logits_bias is None else logits + self.final_logits_bias


# §3 The whole model --------------------------------------------------------------------------------------------


def padding_mask(attention_mask: Tensor) -> Tensor:
    """(B, S) with 1 for real tokens -> bool (B, 1, 1, S): every query may attend to every real key."""
    return (attention_mask != 0)[:, None, None, :]


def segment_mask(segments: Tensor) -> Tensor:
    """(B, S) with 0 for padding and n > 0 for the tokens of the row's n-th text -> bool (B, 1, S, S).

    A row may hold several texts one after another (packed, no padding between them): a token attends to the real
    tokens of its own text only, so each text is encoded as if it were alone. A padding query attends to every real
    key, so a row of one text (segments 0/1) gets exactly :func:`padding_mask`.
    """
    real_key = (segments != 0)[:, None, :]  # (B, 1, S)
    own_text = segments[:, :, None] == segments[:, None, :]  # (B, S, S): query i and key j in one text
    padding_query = (segments == 0)[:, :, None]  # (B, S, 1)
    return (real_key & (own_text | padding_query))[:, None]


def causal_mask(T: int, device: torch.device | None = None) -> Tensor:
    """bool (1, 1, T, T): position i may attend to positions ≤ i, never to a later one (§3.2.3)."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()[None, None]


class Transformer(nn.Module):
    """Encoder-decoder Transformer. :meth:`encode`, :meth:`decode` and :attr:`generator` are kept separate."""

    def __init__(self, c: TransformerConfig) -> None:
        super().__init__()
        self.config = c
        src_lut = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        tgt_lut = src_lut if c.tie_embeddings else nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.src_embed = Embeddings(c, src_lut)
        self.tgt_embed = Embeddings(c, tgt_lut)
        self.encoder_layers = nn.ModuleList([EncoderLayer(c) for _ in range(c.n_encoder_layers)])
        self.decoder_layers = nn.ModuleList([DecoderLayer(c) for _ in range(c.n_decoder_layers)])
        # Pre-LN stacks end with a LayerNorm; post-LN layers already end with one.
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.normalize_before else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.normalize_before else nn.Identity()
        self.generator = Generator(c)
        if c.tie_embeddings:
            self.generator.proj.weight = src_lut.weight

    def encode(self, src: Tensor, src_mask: Tensor, positions: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
        """src (B, S) token ids, src_mask (B, 1, 1 or S, S) -> memory (B, S, d_model), L weights (B, h, S, S).

        positions (B, S): each token's position in its text; default 0, 1, ... along the row.
        """
        if positions is None:
            positions = torch.arange(src.size(1), device=src.device).expand_as(src)  # (B, S)
        x = self.src_embed(src, positions)
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, src_mask)
            weights.append(w)
        return self.encoder_norm(x), weights

    def memory_kv(self, memory: Tensor) -> list[KV]:
        """The encoder output projected by each decoder layer's encoder-decoder attention, computed once."""
        return [layer.src_attn.project_kv(memory) for layer in self.decoder_layers]  # type: ignore[union-attr,operator]

    def decode(
        self,
        tgt: Tensor,
        positions: Tensor,
        memory_kv: list[KV],
        src_mask: Tensor,
        tgt_mask: Tensor,
        past: list[KV] | None = None,
    ) -> tuple[Tensor, list[KV], list[Tensor], list[Tensor]]:
        """Decode T target positions: the whole target teacher-forced (past None), or one step on the cache.

        Args:
            tgt, positions: (B, T) token ids and their positions.
            memory_kv: from :meth:`memory_kv`. src_mask: (B, 1, 1, S).
            tgt_mask: (B, 1, T, T_past + T), e.g. :func:`causal_mask` when teacher-forcing.
            past: per layer, keys and values of earlier positions, each (B, h, T_past, d_k).

        Returns:
            Decoder output (B, T, d_model) (the generator turns it into logits), per layer the present keys and
            values (B, h, T_past + T, d_k), self-attention weights (B, h, T, T_past + T) and cross-attention
            weights (B, h, T, S).
        """
        x = self.tgt_embed(tgt, positions)
        present, self_weights, cross_weights = [], [], []
        for i, layer in enumerate(self.decoder_layers):
            x, kv, sw, cw = layer(x, memory_kv[i], src_mask, tgt_mask, None if past is None else past[i])
            present.append(kv)
            self_weights.append(sw)
            cross_weights.append(cw)
        return self.decoder_norm(x), present, self_weights, cross_weights

    def forward(self, src: Tensor, src_attention_mask: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced training pass: (B, S), (B, S), (B, T) -> logits (B, T, V)."""
        src_mask = padding_mask(src_attention_mask)
        memory, _ = self.encode(src, src_mask)
        T = tgt_in.size(1)
        positions = torch.arange(T, device=tgt_in.device).expand_as(tgt_in)
        out, _, _, _ = self.decode(tgt_in, positions, self.memory_kv(memory), src_mask, causal_mask(T, tgt_in.device))
        return self.generator(out)


def make_model(config: TransformerConfig) -> Transformer:
    """Build a model from its hyperparameters, initialized with Xavier-uniform matrices (as the Annotated
    Transformer does) and embeddings scaled by d_model^-0.5 so that, times √d_model, tokens and positions start at
    the same scale. The pad row stays zero: Marian and CTranslate2 start the decoder from a zero embedding.
    """
    model = Transformer(config)
    for name, p in model.named_parameters():
        if p.dim() > 1 and "lut" not in name:
            nn.init.xavier_uniform_(p)
    for lut in {id(m): m for m in (model.src_embed.lut, model.tgt_embed.lut)}.values():
        nn.init.normal_(lut.weight, std=config.d_model**-0.5)
        with torch.no_grad():
            lut.weight[config.pad_id].zero_()
    return model


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, src_attention_mask: Tensor, max_length: int) -> Tensor:
    """Batched greedy decoding on the key/value cache, the reference for the ONNX and service decoders.

    Starts from ``decoder_start_id``, never emits the pad token, stops a sequence at ``eos_id``.
    Returns (B, ≤ max_length) generated ids without the start token, padded with ``pad_id`` after EOS.
    """
    c = model.config
    src_mask = padding_mask(src_attention_mask)
    memory, _ = model.encode(src, src_mask)
    memory_kv = model.memory_kv(memory)
    B = src.size(0)
    ys = torch.full((B, 1), c.decoder_start_id, dtype=torch.long, device=src.device)
    past: list[KV] | None = None
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out = []
    for t in range(max_length):
        positions = torch.full((B, 1), t, dtype=torch.long, device=src.device)
        step_mask = torch.ones(B, 1, 1, t + 1, dtype=torch.bool, device=src.device)
        x, past, _, _ = model.decode(ys, positions, memory_kv, src_mask, step_mask, past)
        logits = model.generator(x[:, -1])  # (B, V)
        logits[:, c.pad_id] = torch.finfo(logits.dtype).min
        next_id = logits.argmax(-1)
        next_id = torch.where(done, torch.full_like(next_id, c.pad_id), next_id)
        out.append(next_id)
        done |= next_id == c.eos_id
        ys = next_id[:, None]
        if bool(done.all()):
            break
    return torch.stack(out, dim=1)
