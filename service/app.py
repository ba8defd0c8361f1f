"""Builds the FastAPI app. Settings, bundles, runners and schedulers are created in the lifespan, never at import."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service import api
from service.engine import Engine, InputError, warm_up
from service.metrics import Metrics
from service.scheduler import DeadlineExceeded, QueueFull
from service.settings import Settings

log = logging.getLogger("attnserve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name}
        entry["message"] = record.getMessage()
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(settings: Settings) -> None:
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())


class BodyLimit:
    """413 for a body over ``limit`` bytes, by Content-Length or while it streams in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await too_large(limit)(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise InputError(f"the request body is over max_body_bytes={limit}", 413)
            return message

        await self.app(scope, counted, send)


def too_large(limit: int) -> JSONResponse:
    return JSONResponse({"error": f"the request body is over max_body_bytes={limit}"}, status_code=413)


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
                metrics.observe_request(endpoint, status, time.perf_counter() - start)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The attnserve app (``uvicorn --factory service.app:create_app``); ``settings`` default to the environment's.

    Bundles, runners and schedulers are made when the app starts (the lifespan), never here or at import.
    """
    s = settings or Settings()
    holder: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging(s)
        metrics = Metrics()
        engines = [Engine.load(path, s) for path in s.bundles]
        state = api.State(s, engines, metrics)
        app.state.attnserve = holder["state"] = state
        for e in engines:
            metrics.model_info.labels(e.bundle.name, *e.pair, e.exact.provider).set(1)
            await e.start(on_step=metrics.observe_step)
        metrics.track(
            lambda: sum(e.queue_depth for e in engines),
            lambda: sum(e.active_sequences for e in engines),
        )
        if s.warmup:
            for e in engines:
                await asyncio.to_thread(warm_up, e)
        # What start-up made (modules, graphs' metadata, schemas) lives as long as the process: the cyclic
        # collector leaves it out from now on, and collects the young generation every 10,000 allocations rather
        # than 700. int8 over HTTP at 500 requests/s, one thread, three interleaved runs each: the event loop's
        # CPU 4.09 -> 3.73 s of 12.3, p99 150-185 -> 117-153 ms.
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, *gc.get_threshold()[1:])
        state.ready = True
        log.info("serving %s", ", ".join(f"{e.bundle.name} ({'→'.join(e.pair)})" for e in engines))
        try:
            yield
        finally:
            for e in engines:
                await e.stop()

    app = FastAPI(
        title="attnserve",
        description="Machine translation with every attention weight: LibreTranslate-compatible /translate, "
        "per-layer, per-head /attention.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.include_router(api.router)
    app.openapi = api.openapi_with_request_bodies(app)  # type: ignore[method-assign]

    @app.exception_handler(InputError)
    async def input_error(request: Request, e: InputError) -> JSONResponse:
        if "state" in holder:
            holder["state"].metrics.reject({403: "auth", 413: "too_large"}.get(e.status, "invalid"))
        return error(e.status, str(e))

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, e: QueueFull) -> JSONResponse:
        holder["state"].metrics.reject("queue_full")
        return error(503, f"{e}: the server is at capacity", {"Retry-After": str(e.retry_after)})

    @app.exception_handler(DeadlineExceeded)
    async def deadline(request: Request, e: DeadlineExceeded) -> JSONResponse:
        holder["state"].metrics.reject("deadline")
        return error(504, f"{e}; try a shorter text or retry later")

    @app.exception_handler(api.ClientGone)
    @app.exception_handler(ClientDisconnect)  # gone while its body was still coming
    async def gone(request: Request, e: Exception) -> JSONResponse:
        return error(499, "the client closed the connection")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
        return error(422, "invalid request: " + "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return error(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error(500, "internal error; the server logged the details")

    app.add_middleware(BodyLimit, limit=s.max_body_bytes)
    if s.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=s.cors_origins, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(RequestMetrics, metrics=lambda: holder["state"].metrics if "state" in holder else None)
    return app
