"""Builds the FastAPI app. Settings, bundles, runners and schedulers are created in the lifespan, never at import."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from service.engine import Engine
from service.http import errors
from service.http.middleware import BodyLimit, RequestMetrics
from service.http.openapi import openapi_with_request_bodies
from service.http.routes import ROUTERS
from service.http.slow_clients import BodyDeadline
from service.http.state import State
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("attnserve")


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


async def start(settings: Settings) -> State:
    """Load every bundle, start its schedulers and warm it up: the state the routes read, ready."""
    configure_logging(settings)
    metrics = Metrics()
    engines = [Engine.load(path, settings) for path in settings.bundles]
    state = State(settings, engines, metrics)
    for e in engines:
        metrics.model_info.labels(e.bundle.name, *e.pair, e.provider).set(1)
        await e.start(on_step=metrics.observe_step, on_input=metrics.input_tokens.inc)
    metrics.track(
        lambda: sum(e.queue_depth for e in engines),
        lambda: sum(e.active_sequences for e in engines),
    )
    if settings.warmup:
        for e in engines:
            await asyncio.to_thread(e.warm_up)
    freeze_start_up()
    state.ready = True
    log.info("serving %s", ", ".join(f"{e.bundle.name} ({'→'.join(e.pair)})" for e in engines))
    return state


def freeze_start_up() -> None:
    """What start-up made (modules, graphs' metadata, schemas) lives as long as the process: the cyclic collector
    leaves it out from here on and collects the young generation less often, so that its pauses take less of the
    event loop's time."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])


def create_app(settings: Settings | None = None) -> FastAPI:
    """The attnserve app (``uvicorn --factory service.app:create_app``); ``settings`` default to the environment's.

    Bundles, runners and schedulers are made when the app starts (the lifespan), never here or at import.
    """
    s = settings or Settings()
    holder: dict[str, State] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.attnserve = holder["state"] = state = await start(s)
        try:
            yield
        finally:
            for e in state.engines.values():
                await e.stop()

    app = FastAPI(
        title="attnserve",
        description="Machine translation with every attention weight: LibreTranslate-compatible /translate, "
        "per-layer, per-head /attention.",
        version="0.1.0",
        lifespan=lifespan,
    )
    for router in ROUTERS:
        app.include_router(router)
    app.openapi = openapi_with_request_bodies(app)  # type: ignore[method-assign]

    def metrics() -> Metrics | None:
        return holder["state"].metrics if "state" in holder else None

    errors.install(app, metrics)
    app.add_middleware(BodyLimit, limit=s.max_body_bytes)
    app.add_middleware(BodyDeadline, seconds=s.body_timeout_s, metrics=metrics)
    if s.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=s.cors_origins, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app
