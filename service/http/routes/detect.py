"""POST /detect: the languages a text may be in, likeliest first, as LibreTranslate answers them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.errors import TooLarge
from service.http.body import parse_body
from service.http.errors import InvalidField
from service.http.limits import check_texts
from service.http.openapi import ERRORS, request_body
from service.http.schemas import DetectedLanguage, DetectRequest
from service.http.state import State, state_of
from service.text.detect import Detection

router = APIRouter()
CANDIDATES = 3  # LibreTranslate's most


@router.post(
    "/detect",
    response_model=list[DetectedLanguage] | list[list[DetectedLanguage]],
    responses=ERRORS,
    openapi_extra=request_body("DetectRequest", "application/json", "application/x-www-form-urlencoded"),
)
async def detect(request: Request) -> JSONResponse:
    """Detect the language of a text (a list of candidates), or of each text of a list (a list of such lists)."""
    state = state_of(request)
    body = await parse_body(request, DetectRequest)
    state.admission.check(request, body.api_key, body.q)
    texts = [body.q] if isinstance(body.q, str) else body.q
    check_texts(state.settings, texts)
    if isinstance(body.q, str) and not body.q:
        raise InvalidField("invalid request: q: an empty text; send the text whose language to detect")
    for text in texts:
        if len(text) > state.settings.max_chars:
            limit = state.settings.max_chars
            raise TooLarge(f"a text has {len(text)} characters; the limit is max_chars={limit}", "max_chars", limit)
    answers = [candidates(state, t) for t in texts]
    return JSONResponse(answers[0] if isinstance(body.q, str) else answers)


def candidates(state: State, text: str) -> list[dict[str, Any]]:
    """Up to :data:`CANDIDATES` languages of ``text`` with a confidence of at least 1, and always the likeliest.
    A blank text, whose language cannot be told, gives the first served source language with confidence 0 (never
    an empty list, which clients that read the first candidate do not expect).

    Raises:
        NotReady: a blank text while the engines are still loading (the served languages are not known yet).
    """
    found = state.models.detector.detect(text, CANDIDATES)
    if not found:
        found = [Detection(next(iter(state.models.served()))[0], 0.0)]
    kept = found[:1] + [d for d in found[1:] if d.confidence >= 1]
    return [{"confidence": d.confidence, "language": d.language} for d in kept]
