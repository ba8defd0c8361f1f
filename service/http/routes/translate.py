"""POST /translate: LibreTranslate's answer for a text or a list of texts."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.engine import Details, Options, Translation
from service.http.auth import check_api_key
from service.http.body import parse_body
from service.http.errors import UnsupportedFormat
from service.http.limits import check_options, check_texts
from service.http.openapi import ERRORS, request_body
from service.http.schemas import TranslateRequest, TranslateResponse
from service.http.state import state_of

router = APIRouter()


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra=request_body("TranslateRequest", "application/json", "application/x-www-form-urlencoded"),
)
async def translate(request: Request) -> JSONResponse:
    """Translate a text or a list of texts (LibreTranslate-compatible)."""
    arrival = time.monotonic()  # the deadline counts from here
    state = state_of(request)
    body = await parse_body(request, TranslateRequest)
    check_api_key(state.settings, request, body.api_key)
    if body.format != "text":
        raise UnsupportedFormat("format 'html' is not supported; send plain text with format 'text'")
    engine, auto = state.engine(body.source, body.target)
    texts = [body.q] if isinstance(body.q, str) else body.q
    check_texts(state.settings, texts)
    options = Options(
        beam_size=body.beam_size or 1,
        max_length=body.max_length,
        alternatives=body.alternatives,
        length_penalty=body.length_penalty,
        details=body.return_details,
    )
    check_options(state.settings, options)
    translations = await engine.translate(texts, options, request.is_disconnected, arrival)
    detected = engine.pair[0] if auto else None
    return JSONResponse(answer(body, translations, detected))  # already TranslateResponse's: no second validation


def answer(body: TranslateRequest, translations: list[Translation], detected: str | None) -> dict[str, Any]:
    """The response body: one value per field for a single text, a list of them for a list of texts."""
    one = isinstance(body.q, str)
    best = [t.text for t in translations]
    out: dict[str, Any] = {"translatedText": best[0] if one else best}
    if body.alternatives:
        alternatives = [t.alternatives for t in translations]
        out["alternatives"] = alternatives[0] if one else alternatives
    if detected is not None:
        language = {"confidence": 100, "language": detected}
        out["detectedLanguage"] = language if one else [language] * len(translations)
    if body.return_details:
        details = [details_json(t.details) for t in translations if t.details is not None]
        out["details"] = details[0] if one else details
    return out


def details_json(d: Details) -> dict[str, Any]:
    """``return_details``' object for one text."""
    return {
        "source_tokens": d.source_tokens,
        "tokens": d.tokens,
        "score": d.score,
        "token_scores": d.token_scores,
        "alignment": d.alignment,
    }
