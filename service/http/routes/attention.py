"""POST /attention: one text's translation with every attention weight and its tokens."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.engine import AttentionResult, Filters, Options
from service.http.auth import check_api_key
from service.http.body import parse_body
from service.http.limits import check_options
from service.http.openapi import ERRORS, request_body
from service.http.schemas import AttentionRequest, AttentionResponse
from service.http.state import state_of

router = APIRouter()


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
    check_api_key(state.settings, request, body.api_key)
    engine, _ = state.engine(body.source, body.target)
    options = Options(beam_size=body.beam_size, max_length=body.max_length)
    check_options(state.settings, options)
    filters = Filters(body.kinds, body.layers, body.heads)
    result = await engine.attention(body.q, options, filters, body.target_text, request.is_disconnected, arrival)
    # orjson writes the weights from the arrays themselves: a tenth of the event loop's time json takes on lists
    return Response(orjson.dumps(answer(result), option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def answer(result: AttentionResult) -> dict[str, Any]:
    """The response body: tokens, translation and a [layer][head][query][key] array per kind."""
    body: dict[str, Any] = {
        "source_tokens": result.source_tokens,
        "target_tokens": result.target_tokens,
        "decoder_input_tokens": result.decoder_input_tokens,
        "translatedText": result.text,
        "layers": result.layers,
        "heads": result.heads,
    }
    for kind, weights in result.weights.items():
        body[kind] = weights
    return body
