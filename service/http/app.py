"""Builds the FastAPI app. Settings, bundles, runners and schedulers are created in the lifespan, never at import."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.telemetry import TelemetryConfig

from service.http import errors
from service.http.access_log import hide_keys
from service.http.drain import Drain, Shutdown
from service.http.middleware import BodyLimit, RequestMetrics
from service.http.openapi import openapi_with_request_bodies
from service.http.routes import ROUTERS
from service.http.slow_clients import BodyDeadline
from service.http.state import State
from service.metrics import Metrics
from service.serving import startup
from service.settings import Settings

log = logging.getLogger("attnserve")
# FastAPI's OpenTelemetry hooks look for a provider on every request; the service's metrics are Prometheus's.
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


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
    hide_keys()


def create_app(
    settings: Settings | None = None,
    checked: startup.Checked | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    """The attnserve app (``uvicorn --factory service.http.app:create_app``); ``settings`` default to the environment's.

    The lifespan checks the bundles and packages (service/serving/startup.py; ``checked`` skips that), then lets the
    server listen while the served models (service/serving/models.py) build the runners and warm up in the
    background; /translate and /attention answer 503 until then. ``on_fatal`` hears of a start-up failure after
    listening. ``app.state.shutdown`` is the drain that service/cli/server.py begins on SIGTERM.
    """
    s = settings or Settings()
    holder: dict[str, State] = {}
    shutdown = Shutdown(s.shutdown_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_logging(s)
        served = startup.check(s) if checked is None else checked
        app.state.attnserve = holder["state"] = state = State(s, Metrics())
        state.metrics.observe_packages([o.served for o in served.packages])
        loading = asyncio.create_task(state.models.start(served.bundles, on_fatal))
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()
                with suppress(asyncio.CancelledError):
                    await loading
            await state.models.close()

    app = FastAPI(
        title="attnserve",
        description="Machine translation with every attention weight: LibreTranslate-compatible /translate, "
        "per-layer, per-head /attention.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # service/http/routes/docs.py serves /docs and /redoc with their own assets
        redoc_url=None,
        telemetry=NO_TELEMETRY,
    )
    for router in ROUTERS:
        app.include_router(router)
    app.openapi = openapi_with_request_bodies(app)  # type: ignore[method-assign]

    def metrics() -> Metrics | None:
        return holder["state"].metrics if "state" in holder else None

    errors.install(app, metrics)
    app.state.shutdown = shutdown
    add_middleware(app, s, shutdown, metrics)
    return app


def add_middleware(app: FastAPI, s: Settings, shutdown: Shutdown, metrics: Callable[[], Metrics | None]) -> None:
    """The middleware stack, innermost first: body limit, drain, body deadline, CORS, request metrics (outermost,
    so that it counts every answer, refusals included)."""
    app.add_middleware(BodyLimit, limit=s.max_body_bytes)
    app.add_middleware(Drain, shutdown=shutdown)
    app.add_middleware(BodyDeadline, seconds=s.body_timeout_s, metrics=metrics)
    if s.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=s.cors_origins, allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(RequestMetrics, metrics=metrics)
