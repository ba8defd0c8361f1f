"""HTTP routes: validate, hand texts to the right engine's scheduler, shape the answer. Thin by design."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ValidationError

from service.engine import Engine, InputError, Options
from service.metrics import Metrics
from service.schemas import (
    AttentionRequest,
    AttentionResponse,
    ErrorResponse,
    Language,
    TranslateRequest,
    TranslateResponse,
)
from service.settings import Settings

router = APIRouter()
M = TypeVar("M", bound=BaseModel)
STATIC = Path(__file__).parent / "static"
LANGUAGE_NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip


class State:
    """What the lifespan creates and the routes use (``app.state.attnserve``)."""

    def __init__(self, settings: Settings, engines: list[Engine], metrics: Metrics) -> None:
        self.settings = settings
        self.engines = {e.pair: e for e in engines}
        self.metrics = metrics
        self.ready = False

    def engine(self, source: str, target: str) -> tuple[Engine, bool]:
        """The engine for a pair; ``source="auto"`` picks the only pair with that target. Returns (engine, auto).

        Raises:
            InputError: no such pair (400).
        """
        if source == "auto":
            found = [e for (_, t), e in self.engines.items() if t == target]
            if len(found) == 1:
                return found[0], True
            if found:
                raise InputError(f"several pairs translate into {target!r}; set 'source' explicitly", 400)
        elif (source, target) in self.engines:
            return self.engines[(source, target)], False
        pairs = ", ".join(f"{s}→{t}" for s, t in self.engines)
        raise InputError(f"no model translates {source}→{target}; this server serves {pairs} (GET /languages)", 400)


def state_of(request: Request) -> State:
    """The app's :class:`State`. Read directly rather than as a FastAPI dependency: resolving one took 6 % of the
    event loop's time per /translate under load, time that the decoding thread then waits for (the GIL)."""
    state: State = request.app.state.attnserve
    return state


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Malformed body or unknown language pair",
        403: "Missing or wrong API key",
        413: "A limit was exceeded",
        422: "Invalid field",
        503: "Overloaded: retry after Retry-After seconds",
        504: "Deadline passed",
    }.items()
}


async def parse_body(request: Request, model: type[M]) -> M:
    """JSON or form-encoded (LibreTranslate clients send both) into ``model``.

    Raises:
        InputError: the body is not valid JSON or form data (400), or a field is invalid (422).
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    data: Any
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            form = await request.form()
        except Exception as e:  # python-multipart's errors are not part of its API
            raise InputError(f"malformed form body: {e}", 400) from e
        data = {}
        for key in form:
            values = [v for v in form.getlist(key) if isinstance(v, str)]
            data[key] = values if len(values) > 1 or key in ("layers", "heads", "kinds") else values[0]
    else:
        raw = await request.body()
        try:
            data = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"malformed JSON body: {e}; send a JSON object or form fields", 400) from e
        if not isinstance(data, dict):
            raise InputError("the body must be a JSON object (or form fields)", 400)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InputError(validation_message(e), 422) from e


def validation_message(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "invalid request: " + "; ".join(parts)


def check_api_key(state: State, request: Request, body_key: str | None) -> None:
    """Raises InputError (403) when keys are configured and neither ``api_key`` nor a Bearer token matches."""
    keys = state.settings.api_keys
    if not keys:
        return
    auth = request.headers.get("authorization", "")
    given = body_key or (auth[7:].strip() if auth.lower().startswith("bearer ") else None)
    if given is None or not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        what = "a wrong API key" if given else "no API key"
        raise InputError(f"{what}: send a valid key as 'api_key' or 'Authorization: Bearer <key>'", 403)


def options(state: State, beam_size: int | None, max_length: int | None, alternatives: int = 0, **kw: Any) -> Options:
    """A request's decoding options; with ``alternatives`` the beam widens to at least alternatives + 1 and every
    hypothesis it finishes comes back (:func:`distinct` picks the alternatives among them)."""
    s = state.settings
    beam = max(beam_size or 1, alternatives + 1)
    if beam > s.max_beam_size:
        raise InputError(f"beam_size={beam} is over the limit max_beam_size={s.max_beam_size}", 422)
    if max_length is not None and max_length > s.max_length:
        raise InputError(f"max_length={max_length} is over the limit max_length={s.max_length}", 422)
    return Options(beam_size=beam, max_length=max_length, n_best=beam if alternatives else 1, **kw)


def distinct(texts: list[str], n: int) -> list[str]:
    """Up to n of ``texts[1:]`` (hypotheses' texts, best first) that differ from ``texts[0]`` and from each other:
    hypotheses whose pieces differ can read the same, and an alternative that repeats a text tells nothing."""
    seen = {texts[0]}
    out: list[str] = []
    for text in texts[1:]:
        if len(out) == n:
            break
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def openapi_with_request_bodies(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The routes parse their bodies themselves (JSON or form), so FastAPI does not list the request models:
    add them to the OpenAPI components that the routes' request bodies refer to."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for model in (TranslateRequest, AttentionRequest):
                schema["components"]["schemas"][model.__name__] = model.model_json_schema()
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


class ClientGone(Exception):
    """The caller disconnected before its answer was ready; its rows were freed."""


async def submit(request: Request, engine: Engine, decode_requests: list[Any], exact: bool = False) -> list[Any]:
    """Queue the texts and wait for them, giving up (and freeing their rows) if the client disconnects: it looks
    after 1 s, as nearly every answer comes first, then every 2 s. Each look costs the event loop (Starlette's
    is_disconnected, through an anyio cancel scope), and looks add up exactly when answers are slow: past
    saturation, with lookups from 0.25 s on, they took 10 % of the event loop's time, which it then took from the
    decoding thread (the GIL), which made answers slower still. No task of its own either, for the same reason."""
    futures = engine.enqueue(decode_requests, exact)
    try:
        wait = 1.0
        while True:
            done, pending = await asyncio.wait(futures, timeout=wait, return_when=asyncio.FIRST_EXCEPTION)
            for f in done:
                if (failure := f.exception()) is not None:
                    raise failure
            if not pending:
                return [f.result() for f in futures]
            if await request.is_disconnected():
                raise ClientGone()
            wait = min(2 * wait, 2.0)
    finally:
        for f in futures:
            f.cancel()  # nothing for a finished one; an unfinished one's rows are freed


@router.post(
    "/translate",
    response_model=TranslateResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/TranslateRequest"}},
                "application/x-www-form-urlencoded": {"schema": {"$ref": "#/components/schemas/TranslateRequest"}},
            },
            "required": True,
        }
    },
)
async def translate(request: Request) -> JSONResponse:
    """Translate a text or a list of texts (LibreTranslate-compatible)."""
    state = state_of(request)
    body = await parse_body(request, TranslateRequest)
    check_api_key(state, request, body.api_key)
    if body.format != "text":
        raise InputError("format 'html' is not supported; send plain text with format 'text'", 400)
    engine, auto = state.engine(body.source, body.target)
    texts = [body.q] if isinstance(body.q, str) else body.q
    if not texts:
        raise InputError("q is an empty list; send at least one text", 422)
    if len(texts) > state.settings.max_texts:
        raise InputError(f"{len(texts)} texts in one request; the limit is max_texts={state.settings.max_texts}", 413)
    opts = options(
        state,
        body.beam_size,
        body.max_length,
        alternatives=body.alternatives,
        length_penalty=body.length_penalty,
        attention=body.return_details,
    )
    decode_requests = [engine.request(t, opts) for t in texts]
    state.metrics.input_tokens.inc(sum(len(r.src) for r in decode_requests))
    results = await submit(request, engine, decode_requests)
    decoded = [[engine.text(h) for h in r.hypotheses] for r in results]
    best = [t[0] for t in decoded]
    alternatives = [distinct(t, body.alternatives) for t in decoded]
    one = isinstance(body.q, str)
    out: dict[str, Any] = {"translatedText": best[0] if one else best}
    if body.alternatives:
        out["alternatives"] = alternatives[0] if one else alternatives
    if auto:
        detected = {"confidence": 100, "language": engine.pair[0]}
        out["detectedLanguage"] = detected if one else [detected] * len(texts)
    if body.return_details:
        details = [engine.details(q, r.hypotheses[0]) for q, r in zip(decode_requests, results, strict=True)]
        out["details"] = details[0] if one else details
    return JSONResponse(out)  # already TranslateResponse's shape: FastAPI's validation of it again cost 3 %


@router.post(
    "/attention",
    response_model=AttentionResponse,
    response_model_exclude_none=True,
    responses=ERRORS,
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AttentionRequest"}}},
            "required": True,
        }
    },
)
async def attention(request: Request) -> dict[str, Any]:
    """Translate (or force-decode ``target_text``) one text and return every attention weight with its tokens."""
    state = state_of(request)
    body = await parse_body(request, AttentionRequest)
    check_api_key(state, request, body.api_key)
    engine, _ = state.engine(body.source, body.target)
    kinds = list(dict.fromkeys(body.kinds))
    engine.check_filters(kinds, body.layers, body.heads)
    opts = options(state, body.beam_size, body.max_length, attention=True)
    decode_request = engine.request(body.q, opts, target_text=body.target_text)
    state.metrics.input_tokens.inc(len(decode_request.src))
    (result,) = await submit(request, engine, [decode_request], exact=True)
    return engine.attention(decode_request, result, kinds, body.layers, body.heads)


@router.get("/languages", response_model=list[Language])
async def languages(request: Request) -> list[dict[str, Any]]:
    """The served pairs, in LibreTranslate's shape."""
    state = state_of(request)
    targets: dict[str, list[str]] = {}
    for source, target in state.engines:
        targets.setdefault(source, []).append(target)
    return [{"code": s, "name": LANGUAGE_NAMES.get(s, s), "targets": sorted(t)} for s, t in sorted(targets.items())]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorResponse}})
async def readyz(request: Request) -> Response:
    """Ready: every bundle is loaded and has decoded once."""
    state = state_of(request)
    if not state.ready:
        return JSONResponse({"error": "warming up"}, status_code=503, headers={"Retry-After": "1"})
    return JSONResponse({"status": "ready", "models": [e.bundle.name for e in state.engines.values()]})


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    state = state_of(request)
    token = state.settings.metrics_token
    if token:
        auth = request.headers.get("authorization", "")
        if not auth.lower().startswith("bearer "):
            return JSONResponse(
                {"error": "/metrics needs 'Authorization: Bearer <token>'"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(auth[7:].strip().encode(), token.encode()):
            return JSONResponse({"error": "wrong metrics token"}, status_code=403)
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


@router.get("/", include_in_schema=False)
async def explorer() -> Response:
    """The attention explorer page."""
    page = STATIC / "index.html"
    if not page.exists():
        return JSONResponse({"error": "the explorer page is not built"}, status_code=404)
    return FileResponse(page)
