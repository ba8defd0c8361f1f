"""POST /attention: one text's translation with every attention weight and its tokens."""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from service.http.arrays import Encoding, encode
from service.http.auto import detect_sources
from service.http.body import parse_body
from service.http.errors import EmptyText
from service.http.limits import check_options
from service.http.openapi import ERRORS, request_body
from service.http.schemas import AttentionRequest, AttentionResponse
from service.http.state import state_of
from service.serving.translation import AttentionResult, Filters, Options

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
    """Translate (or force-decode ``target_text``) one text and return every attention weight with its tokens."""
    arrival = time.monotonic()  # the deadline counts from here
    state = state_of(request)
    body = await parse_body(request, AttentionRequest)
    state.admission.check(request, body.api_key, body.q)
    if not body.q.strip():
        raise EmptyText("q is empty; send a text with at least one non-space character")
    source = body.source
    if source == "auto":
        source = detect_sources(state.detector, [body.q], body.target, list(state.served()))[0].language
    engine, _ = state.engine(source, body.target)
    options = Options(beam_size=body.beam_size, max_length=body.max_length)
    check_options(state.settings, options)
    filters = Filters(body.kinds, body.layers, body.heads)
    result = await engine.attention(body.q, options, filters, body.target_text, request.is_disconnected, arrival)
    gzipped = "gzip" in request.headers.get("accept-encoding", "")
    content = await asyncio.to_thread(render, result, body.encoding, gzipped)  # megabytes: off the event loop
    headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": "gzip"} if gzipped else {})}
    return Response(content, media_type="application/json", headers=headers)


def answer(result: AttentionResult, encoding: Encoding = "json") -> dict[str, Any]:
    """The response body: tokens, translation and [layer][head][query][key] weights per kind."""
    body: dict[str, Any] = {
        "source_tokens": result.source_tokens,
        "target_tokens": result.target_tokens,
        "decoder_input_tokens": result.decoder_input_tokens,
        "translatedText": result.text,
        "layers": result.layers,
        "heads": result.heads,
    }
    for kind, weights in result.weights.items():
        body[kind] = encode(weights, encoding)
    return body


def render(result: AttentionResult, encoding: Encoding, gzipped: bool) -> bytes:
    """The response's bytes (gzip-compressed when the client accepts it)."""
    content = orjson.dumps(answer(result, encoding), option=orjson.OPT_SERIALIZE_NUMPY)
    return gzip.compress(content, GZIP_LEVEL, mtime=0) if gzipped else content
