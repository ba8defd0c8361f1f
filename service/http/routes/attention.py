"""POST /attention: one text's translation with every attention weight and its tokens."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.engine import AttentionResult, Filters, Options
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
async def attention(request: Request) -> dict[str, Any]:
    """Translate (or force-decode ``target_text``) one text and return every attention weight with its tokens."""
    state = state_of(request)
    body = await parse_body(request, AttentionRequest)
    state.admission.check(request, body.api_key, body.q)
    engine, _ = state.engine(body.source, body.target)
    options = Options(beam_size=body.beam_size, max_length=body.max_length)
    check_options(state.settings, options)
    filters = Filters(body.kinds, body.layers, body.heads)
    result = await engine.attention(body.q, options, filters, body.target_text, request.is_disconnected)
    return answer(result)


def answer(result: AttentionResult) -> dict[str, Any]:
    """The response body: tokens, translation and [layer][head][query][key] lists per kind."""
    body: dict[str, Any] = {
        "source_tokens": result.source_tokens,
        "target_tokens": result.target_tokens,
        "decoder_input_tokens": result.decoder_input_tokens,
        "translatedText": result.text,
        "layers": result.layers,
        "heads": result.heads,
    }
    for kind, weights in result.weights.items():
        body[kind] = weights.tolist()
    return body
