"""/attention's answer from a text's decoded segments: the translation /translate gives, and per segment its
tokens, its attention weights (bertviz's [layer][head][query][key] per kind), where it stands in the text and in
the translation, and the path that restored its spans.

A text's segments decode with attention rows on the exact graphs, then go through /translate's own restoring
(service/serving/restoring.py): spans placed, every segment checked, a broken one recovered. A segment's tokens
and weights are those of the decode that answered: the constrained re-decode's where it did, else the first
decode's (also for ``attention`` and ``appended``, whose text is the first decode's, cleaned).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from service.decoding import DecodeRequest, DecodeResult
from service.runtime.bundle import ModelSpec, Tokenizer
from service.serving.alignment import SegmentInput, alignable
from service.serving.restoring import ForcingRunner, Restored, placed, restore_spans
from service.serving.steps import Step
from service.serving.translation import AttentionResult, Filters, SegmentAttention
from service.text.pipeline import Prepared, TextPipeline


def explaining(
    text: TextPipeline,
    forced: ForcingRunner | None,
    spec: ModelSpec,
    prepared: Prepared,
    requests: list[DecodeRequest],
    filters: Filters,
    recover: bool,
    align: tuple[str, tuple[str, str]] | None = None,
) -> Generator[Step, list[DecodeResult], AttentionResult]:
    """/attention's work as the engine's steps (it yields requests to decode, and is sent their results, or a
    function to call off the event loop, and is sent ``[]``), returning the answer.

    Args:
        text: the pair's text pipeline.
        forced: the engine's forced decoder, as /translate's restoring takes it.
        spec: the model's.
        prepared: the text's segments (:meth:`TextPipeline.segmented`).
        requests: one a segment, with attention rows.
        filters: the kinds, layers and heads to return.
        recover: check and recover the restored segments as /translate does; False for a forced target, the
            caller's text being the answer.
        align: the text and its (source, target) languages, for the answer's word alignments; None: none.
    """
    results = yield requests
    if recover:
        restored = yield from restore_spans(text, forced, prepared, requests, results)
    else:
        restored = placed(text, prepared, requests, results)
    out = explained(text, spec, prepared, requests, results, restored, filters)
    if align is None:
        return out
    inputs = [
        SegmentInput(s.source, s.target, s.model_input, s.target_tokens, np.stack(r.hypotheses[0].cross_attention))
        for s, r in zip(out.segments, results, strict=True)
    ]
    shape = (spec.n_decoder_layers, spec.h)
    return replace(out, alignable=alignable(text.tokenizer, align[1], align[0], out.text, inputs, shape))


def explained(
    text: TextPipeline,
    spec: ModelSpec,
    prepared: Prepared,
    requests: list[DecodeRequest],
    results: list[DecodeResult],
    restored: Restored,
    filters: Filters,
) -> AttentionResult:
    """One text's translation, put together from its segments' restored best texts as /translate puts it together,
    with each segment's weights.

    Args:
        text: the pair's text pipeline.
        spec: the model's (layers, heads, the decoder's start token).
        prepared: the text's segments (:meth:`TextPipeline.segmented`).
        requests: per segment, its request.
        results: per segment, the result that answered, decoded with attention rows.
        restored: per segment, its hypotheses' restored texts and the path that restored its spans.
        filters: the kinds, layers and heads to return.
    """
    outputs = [texts[0] for texts in restored.texts]
    ((translation, _),) = prepared.finish([[o] for o in outputs], 0)
    (places,) = prepared.placed(outputs)
    heads = list(range(spec.h)) if filters.heads is None else filters.heads
    layers = {k: _layers(spec, k) if filters.layers is None else filters.layers for k in dict.fromkeys(filters.kinds)}
    tok = text.tokenizer
    segments = [
        _segment(tok, spec, r, d, layers, heads, (source, target), s.source, path)
        for s, r, d, source, target, path in zip(
            prepared.segments, requests, results, prepared.offsets, places, restored.paths, strict=True
        )
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
    offsets: tuple[tuple[int, int], tuple[int, int]],
    model_input: str,
    spans: str | None,
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
        source=offsets[0],
        target=offsets[1],
        model_input=model_input,
        source_tokens=tok.pieces(request.src),
        target_tokens=tok.pieces(hyp.tokens),
        decoder_input_tokens=tok.pieces([spec.decoder_start_id])
        + tok.pieces([*request.prefix, *hyp.tokens])[: len(request.prefix) + len(hyp.tokens) - 1],
        weights=weights,
        spans=spans,
    )


def _causal(spec: ModelSpec, rows: list[npt.NDArray[np.float32]], P: int = 0) -> npt.NDArray[np.float32]:
    """Decoder self-attention as [L, h, T, P + T] (P: the target prefix' length, usually 0): step t's row
    (L, h, P + t + 1), 0 right of key P + t."""
    T = len(rows)
    out = np.zeros((spec.n_decoder_layers, spec.h, T, P + T), np.float32)
    for t, row in enumerate(rows):
        out[:, :, t, : P + t + 1] = row
    return out
