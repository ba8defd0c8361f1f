"""ASGI middleware: the body size limit and the request metrics, on every HTTP request; the pair a request's
metrics count under."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from service.errors import TooLarge
from service.metrics import Metrics
from service.serving.catalog import Pair, pair_label

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
PAIR = "attnserve.pair"  # the scope's key for the request's pair label


def count_under(request: Request, pair: Pair) -> None:
    """Count the request's latency and refusals under ``pair`` (the first pair it is routed to)."""
    request.scope.setdefault(PAIR, pair_label(pair))


def pair_of(scope: Scope) -> str:
    """The request's pair label; empty until it is routed."""
    return str(scope.get(PAIR, ""))


class BodyLimit:
    """413 for a body over ``limit`` bytes, by Content-Length or while it streams in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit
        self.message = f"the request body is over max_body_bytes={limit}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, message = self.limit, self.message
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await JSONResponse({"error": message}, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            received = await receive()
            seen += len(received.get("body", b""))
            if seen > limit:
                raise TooLarge(message, "max_body_bytes", limit)
            return received

        await self.app(scope, counted, send)


class RequestMetrics:
    """Counts every response by endpoint and status, and times it."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], Metrics | None]) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), 500

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            metrics = self.metrics()
            if metrics is not None:
                endpoint = scope["path"].strip("/") or "other"
                metrics.observe_request(endpoint, status, time.perf_counter() - start, pair_of(scope))
