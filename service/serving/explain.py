"""/attention's answer from a text's decoded segments: the translation /translate gives, and per segment its
tokens, its attention weights (bertviz's [layer][head][query][key] per kind) and where it stands in the text and
in the translation."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from service.decoding import DecodeRequest, DecodeResult
from service.runtime.bundle import ModelSpec, Tokenizer
from service.serving.translation import AttentionResult, Filters, SegmentAttention
from service.text.pipeline import Prepared, TextPipeline


def explained(
    text: TextPipeline,
    spec: ModelSpec,
    prepared: Prepared,
    decoded: list[tuple[DecodeRequest, DecodeResult]],
    filters: Filters,
) -> AttentionResult:
    """One text's translation, put together from its segments' best hypotheses as /translate puts it together,
    with each segment's weights.

    Args:
        text: the pair's text pipeline (restores spans as /translate does).
        spec: the model's (layers, heads, the decoder's start token).
        prepared: the text's segments (:meth:`TextPipeline.segmented`).
        decoded: per segment, its request and its result, decoded with attention rows.
        filters: the kinds, layers and heads to return.
    """
    outputs = [text.restored(s, r.src, d.hypotheses[0]) for s, (r, d) in zip(prepared.segments, decoded, strict=True)]
    ((translation, _),) = prepared.finish([[o] for o in outputs], 0)
    (places,) = prepared.placed(outputs)
    heads = list(range(spec.h)) if filters.heads is None else filters.heads
    layers = {k: _layers(spec, k) if filters.layers is None else filters.layers for k in dict.fromkeys(filters.kinds)}
    segments = [
        _segment(text.tokenizer, spec, r, d, layers, heads, source, target, s.source)
        for s, (r, d), source, target in zip(prepared.segments, decoded, prepared.offsets, places, strict=True)
    ]
    return AttentionResult(translation, heads, layers, segments)


def _layers(spec: ModelSpec, kind: str) -> list[int]:
    return list(range(spec.n_encoder_layers if kind == "encoder" else spec.n_decoder_layers))


def _segment(
    tok: Tokenizer,
    spec: ModelSpec,
    request: DecodeRequest,
    result: DecodeResult,
    layers: dict[str, list[int]],
    heads: list[int],
    source: tuple[int, int],
    target: tuple[int, int],
    model_input: str,
) -> SegmentAttention:
    hyp = result.hypotheses[0]
    arrays = {
        "encoder": result.encoder_attention,  # (L_enc, h, S, S)
        "decoder": _causal(spec, hyp.self_attention, len(request.prefix)),
        "cross": np.stack(hyp.cross_attention, axis=2),  # (L_dec, h, T, S)
    }
    weights: dict[str, npt.NDArray[np.float64]] = {}
    for kind, chosen in layers.items():
        a = arrays[kind]
        assert a is not None, "decoded without attention rows"
        weights[kind] = a[chosen][:, heads].astype(np.float64).round(6)
    return SegmentAttention(
        source=source,
        target=target,
        model_input=model_input,
        source_tokens=tok.pieces(request.src),
        target_tokens=tok.pieces(hyp.tokens),
        decoder_input_tokens=tok.pieces([spec.decoder_start_id])
        + tok.pieces([*request.prefix, *hyp.tokens])[: len(request.prefix) + len(hyp.tokens) - 1],
        weights=weights,
    )


def _causal(spec: ModelSpec, rows: list[npt.NDArray[np.float32]], P: int = 0) -> npt.NDArray[np.float32]:
    """Decoder self-attention as [L, h, T, P + T] (P: the target prefix' length, usually 0): step t's row
    (L, h, P + t + 1), 0 right of key P + t."""
    T = len(rows)
    out = np.zeros((spec.n_decoder_layers, spec.h, T, P + T), np.float32)
    for t, row in enumerate(rows):
        out[:, :, t, : P + t + 1] = row
    return out
