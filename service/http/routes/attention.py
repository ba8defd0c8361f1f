"""POST /attention: one text's translation, as /translate gives it, with every attention weight of each of its
segments (lines, sentences) and their tokens."""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from service.http.alignments import links_json, rule
from service.http.arrays import Encoding, encode
from service.http.body import parse_body
from service.http.errors import EmptyText
from service.http.limits import check_options
from service.http.middleware import count_under
from service.http.openapi import ERRORS, request_body
from service.http.schemas import AttentionRequest, AttentionResponse
from service.http.state import state_of
from service.serving.translation import AttentionResult, Filters, Options, SegmentAttention

router = APIRouter()
GZIP_LEVEL = 1  # the body is mostly digits or near-zero bytes: level 1 gets most of the gain for a fraction of the time


@router.post(
    "/attention",
    response_model=AttentionResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra=request_body("AttentionRequest", "application/json"),
)
async def attention(request: Request) -> Response:
    """Translate (or force-decode ``target_text``) one text as /translate does and return every attention weight of
    each of its segments with their tokens."""
    arrival = time.monotonic()  # the deadline counts from here
    state = state_of(request)
    body = await parse_body(request, AttentionRequest)
    state.admission.check(request, body.api_key, body.q)
    if not body.q.strip():
        raise EmptyText("q is empty; send a text with at least one non-space character")
    source = body.source
    if source == "auto":
        source = state.models.detect_sources([body.q], body.target)[0].language
    route = state.models.route(source, body.target)
    count_under(request, route.pair)
    options = Options(
        beam_size=body.beam_size,
        max_length=body.max_length,
        glossary=body.glossary,
        keep=tuple(body.keep or ()),
        alignments=body.alignments,
    )
    check_options(state.settings, options)
    filters = Filters(body.kinds, body.layers, body.heads)
    result = await route.attention(body.q, options, filters, body.target_text, request.is_disconnected, arrival)
    links = links_json(result.alignable, rule(body.alignment_layer, body.alignment_heads))
    gzipped = "gzip" in request.headers.get("accept-encoding", "")
    content = await asyncio.to_thread(render, result, body.encoding, gzipped, links)  # megabytes: off the event loop
    headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": "gzip"} if gzipped else {})}
    return Response(content, media_type="application/json", headers=headers)


def answer(result: AttentionResult, encoding: Encoding = "json") -> dict[str, Any]:
    """The response body: the translation and its segments, each with its offsets, tokens and [layer][head][query]
    [key] weights per kind. A text of one segment has its tokens and weights at the top level, where bertviz and
    the clients of one sentence read them, and its one segment entry has no weights of its own."""
    segments = [_segment(s) for s in result.segments]
    if len(segments) != 1:
        for entry, s in zip(segments, result.segments, strict=True):
            entry.update(_weights(s, encoding))
        return {"translatedText": result.text, "layers": result.layers, "heads": result.heads, "segments": segments}
    (only,) = result.segments
    return {
        "source_tokens": only.source_tokens,
        "target_tokens": only.target_tokens,
        "decoder_input_tokens": only.decoder_input_tokens,
        "translatedText": result.text,
        "layers": result.layers,
        "heads": result.heads,
        **_weights(only, encoding),
        "segments": segments,
    }


def _segment(s: SegmentAttention) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source_offsets": list(s.source),
        "target_offsets": list(s.target),
        "model_input": s.model_input,
        "source_tokens": s.source_tokens,
        "target_tokens": s.target_tokens,
        "decoder_input_tokens": s.decoder_input_tokens,
    }
    if s.spans is not None:  # absent, as the route's other empty fields are
        entry["spans"] = s.spans
    return entry


def _weights(s: SegmentAttention, encoding: Encoding) -> dict[str, Any]:
    return {kind: encode(weights, encoding) for kind, weights in s.weights.items()}


def render(
    result: AttentionResult, encoding: Encoding, gzipped: bool, alignments: list[dict[str, list[int]]] | None = None
) -> bytes:
    """The response's bytes (gzip-compressed when the client accepts it), with the word alignments if asked."""
    body = answer(result, encoding)
    if alignments is not None:
        body["alignments"] = alignments
    content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return gzip.compress(content, GZIP_LEVEL, mtime=0) if gzipped else content
