"""POST /translate: LibreTranslate's answer for a text or a list of texts."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request

from service.formats.base import Translate
from service.formats.html import translate_html
from service.http.alignments import links_json, rule
from service.http.errors import InvalidField
from service.http.lean import LeanRoute, OrjsonResponse, json_body
from service.http.limits import check_options, check_texts
from service.http.middleware import count_under
from service.http.openapi import ERRORS, request_body
from service.http.schemas import TranslateRequest, TranslateResponse
from service.http.state import state_of
from service.serving.route import Route
from service.serving.translation import Details, Hop, Options, Translation, check_unicode
from service.text.detect import Detection

router = APIRouter(route_class=LeanRoute)  # the endpoint takes the Request and answers itself


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra=request_body("TranslateRequest", "application/json", "application/x-www-form-urlencoded"),
)
async def translate(request: Request) -> OrjsonResponse:
    """Translate a text or a list of texts (LibreTranslate-compatible)."""
    arrival = time.monotonic()  # the deadline counts from here
    state = state_of(request)
    body = await json_body(request, TranslateRequest)
    state.admission.check(request, body.api_key, body.q)
    models = state.models
    models.served()  # 503 while loading, whatever the source
    route = None if body.source == "auto" else models.route(body.source, body.target)  # auto: per text, below
    if route is not None:
        count_under(request, route.pair)
    texts = [body.q] if isinstance(body.q, str) else body.q
    check_texts(state.settings, texts)
    if route is None:
        check_unicode(texts)  # before language detection, which cannot read an unpaired surrogate
    options = Options(
        beam_size=body.beam_size,
        max_length=body.max_length,
        alternatives=body.alternatives,
        length_penalty=body.length_penalty,
        details=body.return_details,
        glossary=body.glossary,
        keep=tuple(body.keep or ()),
        raw=body.raw,
        alignments=body.alignments,
    )
    check_options(state.settings, options)
    if body.raw and body.format == "html":
        raise InvalidField("raw: the text goes to the model as given, and format 'html' parses it; send one")
    detected: list[Detection] | None = None
    if body.format == "html":
        translations, detected = await translate_pages(request, body, texts, options, arrival)
    elif route is None:
        gone = request.is_disconnected
        translations, detected = await models.translate_auto(texts, body.target, options, gone, arrival)
        count_under(request, (detected[0].language, body.target))
    else:
        translations = await route.translate(texts, options, request.is_disconnected, arrival)
    return OrjsonResponse(answer(body, translations, detected))  # already TranslateResponse's: no second validation


async def translate_pages(
    request: Request, body: TranslateRequest, pages: list[str], options: Options, arrival: float
) -> tuple[list[Translation], list[Detection] | None]:
    """``format: "html"``: each page's text units translated by its pair's route (detected with ``auto``)."""
    state = state_of(request)
    detected = None
    sources = [body.source] * len(pages)
    if body.source == "auto":
        detected = state.models.detect_sources(pages, body.target)
        sources = [d.language for d in detected]
    plain = replace(options, alternatives=0, details=False, alignments=False)
    translations = []
    for page, source in zip(pages, sources, strict=True):
        route = state.models.route(source, body.target)
        count_under(request, route.pair)
        units = html_translator(route, plain, state.settings.max_texts, arrival)
        translations.append(Translation(await translate_html(page, units), [], None))
    return translations, detected


def html_translator(route: Route, options: Options, size: int, arrival: float) -> Translate:
    """An HTML text's units translated ``size`` at a time (a page holds more of them than one request may), all
    within the request's deadline."""

    async def translate(texts: list[str]) -> list[str | None]:
        out: list[str | None] = []
        for i in range(0, len(texts), size):
            out += [t.text for t in await route.translate(texts[i : i + size], options, arrival=arrival)]
        return out

    return translate


def answer(body: TranslateRequest, translations: list[Translation], detected: list[Detection] | None) -> dict[str, Any]:
    """The response body: one value per field for a single text, a list of them for a list of texts."""
    one = isinstance(body.q, str)
    best = [t.text for t in translations]
    out: dict[str, Any] = {"translatedText": best[0] if one else best}
    if body.alternatives:
        alternatives = [t.alternatives for t in translations]
        out["alternatives"] = alternatives[0] if one else alternatives
    if detected is not None:
        languages = [{"confidence": d.confidence, "language": d.language} for d in detected]
        out["detectedLanguage"] = languages[0] if one else languages
    if body.return_details:
        details = [translation_details(t) for t in translations]
        out["details"] = details[0] if one else details
    if body.alignments:
        chosen = rule(body.alignment_layer, body.alignment_heads)
        links = [links_json(t.alignable, chosen) for t in translations]
        out["alignments"] = links[0] if one else links
    return out


def translation_details(t: Translation) -> dict[str, Any]:
    """``return_details``' object for one text: its details, or through a pivot language only its ``hops``, each
    with its pair, its text and its details."""
    if t.hops:
        return {"hops": [hop_json(h) for h in t.hops]}
    return details_json(t.details) if t.details is not None else {}


def hop_json(h: Hop) -> dict[str, Any]:
    """One hop of a pivot translation."""
    return {"source": h.source, "target": h.target, "translatedText": h.text, **translation_details(
        Translation(h.text, [], h.details)
    )}  # fmt: skip


def details_json(d: Details) -> dict[str, Any]:
    """``return_details``' object for one text."""
    return {
        "source_tokens": d.source_tokens,
        "tokens": d.tokens,
        "score": d.score,
        "token_scores": d.token_scores,
        "alignment": d.alignment,
        "coverage": d.coverage,
        "confidence": d.confidence,
        "flags": d.flags,
        "spans": d.spans,
    }
