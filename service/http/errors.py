"""The HTTP layer's own refusals, and the one table that maps every refusal to a status code and an error body.

Every error answer is ``{"error": "<what is wrong and how to fix it>"}``, never a stack trace.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service.errors import (
    AmbiguousSource,
    ClientGone,
    InvalidText,
    LayoutMismatch,
    ModelsBusy,
    NoSuchFile,
    NoSuchIndex,
    NotReady,
    OptionOverLimit,
    PairUnavailable,
    PivotOnly,
    TooLarge,
    UnknownPair,
    UnreadableFile,
)
from service.http.middleware import pair_of
from service.metrics import Metrics
from service.serving.scheduler import DeadlineExceeded, QueueFull

log = logging.getLogger("attnserve")


class MalformedBody(Exception):
    """The body is neither a JSON object nor form data."""


class InvalidField(Exception):
    """A field of the body is missing or has a wrong value."""


class UnsupportedFormat(Exception):
    """The request asks for a text format the service does not translate."""


class EmptyText(Exception):
    """/attention got an empty text: there is nothing whose attention to show."""


class Forbidden(Exception):
    """API keys are configured and the request carries none of them."""


class RateLimited(Exception):
    """A client is over its requests or characters a minute; ``retry_after`` seconds until it is not."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class KeyLimitExceeded(Exception):
    """A request over one of its client's limits that waiting cannot cure (``field`` names it, ``limit`` is its
    value)."""

    def __init__(self, message: str, field: str, limit: int) -> None:
        super().__init__(message)
        self.field, self.limit = field, limit


def validation_message(errors: Sequence[Mapping[str, Any]], fields: Sequence[str] = ()) -> str:
    """Pydantic's errors as one line: ``invalid request: <field>: <message>; ...``; a field the body may not have
    is named as unknown, with ``fields`` (those it may have) after it."""
    parts = [
        f"{'.'.join(str(x) for x in err['loc']) or 'body'}: "
        + ("unknown field" if err["type"] == "extra_forbidden" else err["msg"])
        for err in errors
    ]
    if fields and any(err["type"] == "extra_forbidden" for err in errors):
        parts.append(f"the fields are {', '.join(fields)}")
    return "invalid request: " + "; ".join(parts)


class ErrorResponse(JSONResponse):
    """JSON that stays valid when a message echoes input that is not valid Unicode (an unpaired surrogate): such
    characters are written as JSON escapes rather than failing UTF-8 encoding."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error answer: ``{"error": message}`` with ``status``."""
    return ErrorResponse({"error": message}, status_code=status, headers=headers)


@dataclass(frozen=True)
class Rule:
    """How one kind of refusal is answered: its status, its ``rejected_total`` reason (None: not counted), its
    message and headers."""

    status: int
    reason: str | None
    message: Callable[[Any], str] = str
    headers: Callable[[Any], dict[str, str]] | None = None


def _gone(_: Exception) -> str:
    return "the client closed the connection"


def _retry_after(e: QueueFull | RateLimited | ModelsBusy) -> dict[str, str]:
    return {"Retry-After": str(e.retry_after)}


def _retry_soon(_: NotReady | PairUnavailable) -> dict[str, str]:
    return {"Retry-After": "1"}


STATUS: dict[type[Exception], Rule] = {
    MalformedBody: Rule(400, "invalid"),
    UnsupportedFormat: Rule(400, "invalid"),
    UnknownPair: Rule(400, "invalid"),
    PivotOnly: Rule(400, "invalid"),
    AmbiguousSource: Rule(400, "invalid"),
    UnreadableFile: Rule(400, "invalid"),
    EmptyText: Rule(400, "invalid"),
    Forbidden: Rule(403, "auth"),
    NoSuchFile: Rule(404, None),
    TooLarge: Rule(413, "too_large"),
    InvalidField: Rule(422, "invalid"),
    OptionOverLimit: Rule(422, "invalid"),
    NoSuchIndex: Rule(422, "invalid"),
    LayoutMismatch: Rule(422, "invalid"),
    RequestValidationError: Rule(422, None, lambda e: validation_message(e.errors())),
    ClientGone: Rule(499, None, _gone),
    ClientDisconnect: Rule(499, None, _gone),  # gone while its body was still coming
    QueueFull: Rule(503, "queue_full", lambda e: f"{e}: the server is at capacity", _retry_after),
    DeadlineExceeded: Rule(504, "deadline", lambda e: f"{e}; try a shorter text or retry later"),
    InvalidText: Rule(400, "invalid"),
    NotReady: Rule(503, None, str, _retry_soon),
    ModelsBusy: Rule(503, "models_busy", str, _retry_after),
    PairUnavailable: Rule(503, None, str, _retry_soon),
    RateLimited: Rule(429, "rate_limited", str, _retry_after),
    KeyLimitExceeded: Rule(413, "key_limited"),
}


def install(app: FastAPI, metrics: Callable[[], Metrics | None]) -> None:
    """Answer every exception as :data:`STATUS` says (counting rejections in ``metrics()``), Starlette's own
    (404, 405) with their status, and anything else as a logged 500."""
    for kind, rule in STATUS.items():
        app.add_exception_handler(kind, _handler(rule, metrics))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error(500, "internal error; the server logged the details")


def _handler(rule: Rule, metrics: Callable[[], Metrics | None]) -> Callable[[Request, Exception], Any]:
    async def handle(request: Request, e: Exception) -> JSONResponse:
        if rule.reason is not None and (m := metrics()) is not None:
            m.reject(rule.reason, pair_of(request.scope))
        return error(rule.status, rule.message(e), rule.headers(e) if rule.headers else None)

    return handle
