"""Builds the FastAPI app. Settings, bundles, runners and schedulers are created in the lifespan, never at import."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from functools import partial

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
from service.metrics import Metrics, PairQueue
from service.runtime.bundle import Bundle
from service.runtime.gpu_memory import device_memory
from service.runtime.providers import CUDA
from service.runtime.runner import trim_memory
from service.serving import startup
from service.serving.budget import MiB
from service.serving.catalog import Pair, pair_label, pairs_of
from service.serving.core_sharing import WhileSaturated
from service.serving.engine import Engine, Pooled, Runners
from service.serving.pairs import Hooks, PairRegistry
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


async def start(state: State, bundles: list[Bundle], on_fatal: Callable[[str], None] | None = None) -> None:
    """Register every bundle's pairs (service/serving/pairs.py), load and warm up the first ``eager_models`` that
    fit in ``models_memory_mb``, then mark ``state`` ready; on the event loop while the server already answers
    (/readyz is 503 meanwhile). The others load when a request first needs them.

    A failure is logged in one line, left in /readyz's answer, and handed to ``on_fatal`` (the command line exits).
    """
    settings, metrics = state.settings, state.metrics
    saturation = WhileSaturated(settings.max_batch_size) if settings.sched_batch == "saturated" else None
    hooks = Hooks(
        loaded=lambda pairs, seconds: metrics.observe_load(labels(pairs), seconds),
        unloaded=lambda pairs: metrics.observe_unload(labels(pairs)),
    )
    load, unload = partial(load_engine, state, saturation, Pooled.of(settings)), partial(unload_engine, state)
    registry = PairRegistry[Engine](bundles, load, unload, settings.models_memory_mb * MiB, hooks)
    metrics.track_queues(partial(pair_queues, registry, settings.queue_size * settings.decode_threads))
    metrics.track_pairs(registry.pair_states)
    try:
        state.serve(registry)
        await registry.preload(bundles[: settings.eager_models])
    except Exception as e:  # a graph ONNX Runtime refuses, a provider that fails: the process cannot serve
        cause = e.__cause__ or e
        state.not_ready = f"start-up failed: {type(cause).__name__}: {' '.join(str(cause).split())}"
        log.error("%s", state.not_ready)
        log.debug("start-up failure", exc_info=True)
        if on_fatal is not None:
            on_fatal(state.not_ready)
        return
    freeze_start_up()
    state.ready = True
    loaded = ", ".join(f"{b.name} ({'→'.join(p)})" for b in registry.loaded() for p in pairs_of(b.manifest))
    log.info("serving %d pairs; loaded %s", len(state.routes), loaded or "none yet")


def labels(pairs: list[Pair]) -> list[str]:
    return [pair_label(p) for p in pairs]


def pair_queues(registry: PairRegistry[Engine], capacity: int) -> dict[str, PairQueue]:
    """Every pair a bundle serves with its queues now (empty while its bundle is not loaded); ``capacity``: the
    texts one of its queues holds."""
    depth, rows = Counter[str](), Counter[str]()
    for engine in registry.engines():
        depth.update(engine.queued_by_pair())
        rows.update(engine.rows_by_pair())
    return {p: PairQueue(depth[p], rows[p], capacity) for p in labels(registry.pairs)}


async def load_engine(
    state: State, saturation: WhileSaturated | None, pooled: Pooled, bundle: Bundle
) -> dict[Pair, Engine]:
    """A bundle's engines by pair: its runners (on a thread), its schedulers started, warmed up when ``warmup`` is
    on; one engine a target, sharing them (a multi-target bundle); every bundle's engines share ``pooled``, the
    process's memory budget and response cache."""
    settings, metrics = state.settings, state.metrics
    runners = await asyncio.to_thread(Runners.build, bundle, settings)
    engine = Engine(bundle, settings, runners, pooled=pooled)
    await engine.start(
        on_step=metrics.observe_step,
        on_input=metrics.input_tokens.inc,
        on_cache=metrics.observe_cache,
        saturation=saturation,
        on_spans=metrics.observe_spans,
    )
    try:
        if settings.warmup:
            await asyncio.to_thread(engine.warm_up)
        served = engine.for_targets()
    except BaseException:
        await engine.stop()
        raise
    for e in served:
        metrics.model_info.labels(bundle.name, *e.pair, e.provider, e.variant).set(1)
    if any(e.provider == CUDA for e in served):
        metrics.track_gpu_memory(device_memory)
    return {e.pair: e for e in served}


async def unload_engine(state: State, engines: Mapping[Pair, Engine]) -> None:
    """Stop a bundle's schedulers (its first engine's, which the others share) and hand the memory they held back
    to the system."""
    for e in engines.values():
        state.metrics.model_info.remove(e.bundle.name, *e.pair, e.provider, e.variant)
    await next(iter(engines.values())).stop()
    del engines
    await asyncio.to_thread(release_memory)


def release_memory() -> None:
    """Collect what an unloaded engine left (its sessions may sit in reference cycles, which the start-up freeze
    would keep for good), freeze what remains again, and trim the heap."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    trim_memory()


def freeze_start_up() -> None:
    """What start-up made (modules, graphs' metadata, schemas) lives as long as the process: the cyclic collector
    leaves it out from here on and collects the young generation less often, so that its pauses take less of the
    event loop's time."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])


def create_app(
    settings: Settings | None = None,
    checked: startup.Checked | None = None,
    on_fatal: Callable[[str], None] | None = None,
) -> FastAPI:
    """The attnserve app (``uvicorn --factory service.http.app:create_app``); ``settings`` default to the environment's.

    The lifespan checks the bundles and packages (service/serving/startup.py; ``checked`` skips that), then lets the
    server listen while :func:`start` builds the runners and warms up in the background; /translate and /attention
    answer 503 until then. ``on_fatal`` hears of a start-up failure after listening. ``app.state.shutdown`` is the
    drain that service/cli/server.py begins on SIGTERM.
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
        loading = asyncio.create_task(start(state, served.bundles, on_fatal))
        try:
            yield
        finally:
            if not loading.done():
                loading.cancel()
                with suppress(asyncio.CancelledError):
                    await loading
            if state.pairs is not None:
                await state.pairs.close()

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
