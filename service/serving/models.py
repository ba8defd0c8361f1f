"""The served models, as the routes call them: which pairs are served and by what (a bundle's engine, or two hops
through the pivot language), ``source: "auto"``, and the engines' lifecycle (the registry of bundles, loading with
runners, schedulers and warm-up, unloading, readiness, reloading). The HTTP layer parses, authenticates and shapes
answers; it asks this object for everything else.

A reload (SIGHUP, or a change seen in the watched directories) reads the bundles and packages again as start-up
does (service/serving/startup.py's ``survey``, the bundles already served not read again): new bundles are checked,
loaded and warmed (when they fit in ``models_memory_mb``) before their pairs are served; bundles gone are out of the
pairs at once and unloaded once their requests in flight end; what cannot be served is skipped, logged and counted.
Requests to the other pairs keep their engines throughout."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from functools import partial
from pathlib import Path

from service.errors import AmbiguousSource, NotReady, PairUnavailable, UnknownPair
from service.metrics import Metrics, PairQueue
from service.runtime.bundle import Bundle
from service.runtime.gpu_memory import device_memory
from service.runtime.manifest import MANIFEST
from service.runtime.providers import CUDA
from service.runtime.runner import trim_memory
from service.serving.auto import detect_sources, translate_auto
from service.serving.budget import MiB
from service.serving.catalog import Pair, footprint, pair_label, pairs_of, pivots
from service.serving.core_sharing import WhileSaturated
from service.serving.engine import Engine, Pooled, Runners
from service.serving.pairs import Hooks, PairRegistry
from service.serving.pivot import PivotRoute
from service.serving.route import Direct, Route
from service.serving.startup import StartupError, survey
from service.serving.translation import Gone, Options, Translation
from service.settings import Settings
from service.text.detect import Detection, Detector
from service.text.glossary import read_glossary

log = logging.getLogger("attnserve")
WATCH_DEPTH = 3  # <packages>/<package>/model/model.bin; <bundles>/<bundle>/<file>


class Models:
    """Every served pair's route, the bundles behind them and whether they are ready (``app.state.attnserve.models``).

    Args:
        settings: the service's settings.
        metrics: where loads, unloads, steps and the pairs' states are recorded.
        detector: language identification for ``source: "auto"`` and /detect.
    """

    def __init__(self, settings: Settings, metrics: Metrics, detector: Detector | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.detector = detector or Detector()
        self.registry: PairRegistry[Engine] | None = None  # the bundles behind the pairs, once registered
        self.routes: dict[Pair, Route] = {}  # every served pair: direct ones, then those through the pivot language
        self.ready = False
        self.not_ready = "loading the models"  # why not ready, for /readyz and 503s
        self._saturation: WhileSaturated | None = None
        self._pooled = Pooled.of(settings)  # the process's memory budget and response cache, shared by every engine
        self._reloading = asyncio.Lock()
        self._manifests: dict[Path, int | None] = {}  # each served bundle's manifest time when it was read
        self._wanted = asyncio.Event()  # a reload asked for (SIGHUP)
        self._watcher: asyncio.Task[None] | None = None

    async def start(self, bundles: list[Bundle], on_fatal: Callable[[str], None] | None = None) -> None:
        """Register every bundle's pairs (service/serving/pairs.py), load and warm up the first ``eager_models`` that
        fit in ``models_memory_mb``, then mark ready; on the event loop while the server already answers (/readyz is
        503 meanwhile). The others load when a request first needs them.

        A failure is logged in one line, left in /readyz's answer, and handed to ``on_fatal`` (the command line
        exits).
        """
        settings, metrics = self.settings, self.metrics
        if settings.sched_batch == "saturated":
            self._saturation = WhileSaturated(settings.max_batch_size)
        hooks = Hooks(
            loaded=lambda pairs, seconds: metrics.observe_load(labels(pairs), seconds),
            unloaded=lambda pairs: metrics.observe_unload(labels(pairs)),
        )
        # Under a bound, start-up's check_fits has read each footprint (catalog caches them); without one, none is read.
        weights = partial(footprint, override=settings.graph_variant)
        registry = PairRegistry[Engine](
            bundles, self._load, self._unload, weights, settings.models_memory_mb * MiB, hooks
        )
        self._manifests = {b.path: manifest_time(b.path) for b in bundles}
        self.registry = registry
        metrics.track_queues(partial(pair_queues, registry, settings.queue_size * settings.decode_threads))
        metrics.track_pairs(registry.pair_states)
        try:
            self._route_pairs()
            await registry.preload(bundles[: settings.eager_models])
        except Exception as e:  # a graph ONNX Runtime refuses, a provider that fails: the process cannot serve
            cause = e.__cause__ or e
            self.not_ready = f"start-up failed: {type(cause).__name__}: {' '.join(str(cause).split())}"
            log.error("%s", self.not_ready)
            log.debug("start-up failure", exc_info=True)
            if on_fatal is not None:
                on_fatal(self.not_ready)
            return
        freeze_start_up()
        self.ready = True
        loaded = ", ".join(f"{b.name} ({'→'.join(p)})" for b in registry.loaded() for p in pairs_of(b.manifest))
        log.info("serving %d pairs; loaded %s", len(self.routes), loaded or "none yet")
        with suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no SIGHUP here
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._wanted.set)
        self._watcher = asyncio.create_task(self.watch())

    async def watch(self) -> None:
        """Reload on SIGHUP, and when the watched directories' entries change (looked at every
        ``reload_interval_s``; 0: only on SIGHUP)."""
        interval = self.settings.reload_interval_s or None
        last = await asyncio.to_thread(directory_state, watched(self.settings))
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wanted.wait(), interval)
            asked = self._wanted.is_set()
            self._wanted.clear()
            now = await asyncio.to_thread(directory_state, watched(self.settings))
            if asked or now != last:
                last = now
                try:
                    await self.reload()
                except Exception as e:  # a pivot pair's glossary file broken meanwhile: watching goes on
                    log.error("reload failed: %s: %s", type(e).__name__, " ".join(str(e).split()))
                    self.metrics.reloads.labels("failed").inc()

    async def reload(self) -> None:
        """Serve what the settings' directories hold now (the module's docstring); never raises: a failure is
        logged and counted."""
        registry = self.registry
        if not self.ready or registry is None:
            return
        async with self._reloading:
            known = {  # not read again: the bundles served whose manifest is the one read
                s.bundle.path: s.bundle
                for s in registry.slots
                if not s.retired and manifest_time(s.bundle.path) == self._manifests.get(s.bundle.path)
            }
            try:
                checked = await asyncio.to_thread(survey, self.settings, known)
            except StartupError as e:  # the packages directory cannot be listed
                log.error("reload failed: %s", e)
                self.metrics.reloads.labels("failed").inc()
                return
            for reason in checked.refused:
                log.warning("reload: skipped %s", reason)
            new = [b for b in checked.bundles if b.path not in known]
            registry.stage(new)
            served, failed = [], 0
            for bundle in checked.bundles:
                if bundle.path not in known:
                    try:
                        await registry.preload([bundle])
                    except PairUnavailable:  # logged by the registry
                        registry.drop(bundle)
                        failed += 1
                        continue
                served.append(bundle)
            registry.serve(served)
            self._manifests.update({b.path: manifest_time(b.path) for b in new})
            self._route_pairs()
            self.metrics.bundles_skipped.set(len(checked.refused) + failed)
            self.metrics.observe_packages([o.served for o in checked.packages])
            self.metrics.reloads.labels("done").inc()
            gone = [p for p in known if p not in {b.path for b in served}]
            log.info(
                "reloaded: serving %d pairs; %d bundles added, %d gone",
                len(self.routes), len(new) - failed, len(gone),
            )  # fmt: skip

    def _route_pairs(self) -> None:
        """Serve the registry's pairs, and through ``pivot_language`` the pairs no bundle serves where both hops
        are served (the routes replaced at once: a request holds the route it found).

        Raises:
            BundleError: a pivot pair's glossary file is malformed.
        """
        assert self.registry is not None
        registry, s = self.registry, self.settings
        direct: dict[Pair, Route] = {pair: Direct(registry, pair) for pair in registry.pairs}
        routes = dict(direct)
        for p in pivots(direct, s.pivot_language):
            first, second = p.hops
            glossary = read_glossary(s.glossary_dir, *p.pair)
            decoding = s.pair_defaults.get("-".join(p.pair))
            routes[p.pair] = PivotRoute(p, direct[first], direct[second], glossary, decoding)
        self.routes = routes

    async def _load(self, bundle: Bundle) -> dict[Pair, Engine]:
        """A bundle's engines by pair: its runners (on a thread), its schedulers started, warmed up when ``warmup``
        is on; one engine a target, sharing them (a multi-target bundle); every bundle's engines share the process's
        memory budget and response cache."""
        settings, metrics = self.settings, self.metrics
        runners = await asyncio.to_thread(Runners.build, bundle, settings)
        engine = Engine(bundle, settings, runners, pooled=self._pooled)
        await engine.start(
            on_step=metrics.observe_step,
            on_input=metrics.input_tokens.inc,
            on_cache=metrics.observe_cache,
            saturation=self._saturation,
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

    async def _unload(self, engines: Mapping[Pair, Engine]) -> None:
        """Stop a bundle's schedulers (its first engine's, which the others share) and hand the memory they held
        back to the system."""
        for e in engines.values():
            self.metrics.model_info.remove(e.bundle.name, *e.pair, e.provider, e.variant)
        await next(iter(engines.values())).stop()
        del engines
        await asyncio.to_thread(release_memory)

    async def close(self) -> None:
        """Stop watching and every engine (the lifespan's end)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with suppress(asyncio.CancelledError):
                await self._watcher
        with suppress(ValueError, RuntimeError, NotImplementedError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self.registry is not None:
            await self.registry.close()

    def bundles(self) -> tuple[list[str], list[str]]:
        """The names of every registered bundle and of those loaded now (/readyz).

        Raises:
            NotReady: not ready.
        """
        self.served()
        assert self.registry is not None
        served = [s for s in self.registry.slots if not s.retired]
        return [s.bundle.name for s in served], [s.bundle.name for s in served if s.engine is not None]

    def served(self) -> dict[Pair, Route]:
        """Every served pair's route, once the server is ready (the eager bundles loaded and warm).

        Raises:
            NotReady: the bundles are still loading (or failed to): which pairs are served is not known yet.
        """
        if not self.ready:
            raise NotReady(f"the server is not ready ({self.not_ready}); retry shortly")
        return self.routes

    def route(self, source: str, target: str) -> Route:
        """The route of a pair; ``source="auto"`` picks the only pair with that target.

        Raises:
            UnknownPair: no route serves the pair.
            AmbiguousSource: ``source="auto"`` and several pairs translate into ``target``.
            NotReady: the bundles are still loading (or failed to).
        """
        routes = self.served()
        if source == "auto":
            found = [r for (_, t), r in routes.items() if t == target]
            if len(found) == 1:
                return found[0]
            if found:
                raise AmbiguousSource(f"several pairs translate into {target!r}; set 'source' explicitly")
        elif (source, target) in routes:
            return routes[(source, target)]
        pairs = ", ".join(f"{s}→{t}" for s, t in routes)
        raise UnknownPair(f"no model translates {source}→{target}; this server serves {pairs} (GET /languages)")

    def detect_sources(self, texts: Sequence[str], target: str) -> list[Detection]:
        """Each text's language, among the sources of the pairs served into ``target``
        (service/serving/auto.py).

        Raises:
            UnknownPair, NotReady: as :func:`~service.serving.auto.detect_sources` and :meth:`served`.
        """
        return detect_sources(self.detector, texts, target, list(self.served()))

    async def translate_auto(
        self,
        texts: Sequence[str],
        target: str,
        options: Options,
        gone: Gone | None = None,
        arrival: float | None = None,
    ) -> tuple[list[Translation], list[Detection]]:
        """Texts whose language is detected, each group of one language through its pair's route; the
        translations and detections in the texts' order.

        Raises:
            What :func:`~service.serving.auto.translate_auto` and :meth:`served` raise.
        """
        return await translate_auto(self.served(), self.detector, texts, target, options, gone, arrival)


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


def manifest_time(bundle: Path) -> int | None:
    """When a bundle's manifest was last written (None: it has none): a bundle replaced in place is read again."""
    try:
        return (bundle / MANIFEST).stat().st_mtime_ns
    except OSError:
        return None


def watched(settings: Settings) -> list[Path]:
    """The directories a reload follows: each of ``bundles`` (a directory of bundles gains or loses members), the
    packages directory and ``argos_cache`` (an import finished elsewhere)."""
    packages = settings.packages_dir()
    return [*settings.bundles, *([packages, settings.argos_cache] if packages is not None else [])]


def directory_state(directories: Sequence[Path], depth: int = WATCH_DEPTH) -> list[object]:
    """What a change of the directories changes: every entry down to ``depth`` levels (a package's ``model/``
    files) with its size and modification time; None for a directory that cannot be read."""
    return [entries(d, depth) for d in directories]


def entries(directory: Path, depth: int) -> list[tuple[str, int, int, object]] | None:
    try:
        found = sorted(directory.iterdir())
        return [
            (
                e.name,
                (st := e.stat()).st_mtime_ns,
                st.st_size,
                entries(e, depth - 1) if depth > 1 and e.is_dir() else None,
            )
            for e in found
        ]
    except OSError:  # gone meanwhile, or unreadable
        return None


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
