"""Which bundles serve which language pairs, and which of them are loaded.

Every pair has a bundle behind it (several pairs may share one: a multi-target bundle). A bundle is loaded
(runners, schedulers, warm-up, an engine for each of its pairs: the ``load`` it is given) when a request first needs
it, or at start-up by :meth:`PairRegistry.preload`, and counts its footprint (the weights its sessions hold:
service/serving/catalog.py's ``footprint``) against a memory bound. When loading one more would pass the bound, the
least recently used bundle with no request in flight is unloaded; when none can be, the request gets
:class:`~service.errors.ModelsBusy`. Concurrent first requests for one bundle wait on one load. The bundles served
may change while serving (:meth:`PairRegistry.serve`, a reload): a bundle no longer served leaves its pairs at once
and is unloaded once its requests in flight have ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, Literal, TypeVar

from service.errors import ModelsBusy, PairUnavailable, UnknownPair
from service.runtime.bundle import Bundle
from service.serving.catalog import Pair, pairs_of

log = logging.getLogger(__name__)

E = TypeVar("E")  # a pair's engine: service/serving/engine.py's Engine, or a fake in the tests
State = Literal["loaded", "loading", "unloaded"]
STATES: tuple[State, ...] = ("loaded", "loading", "unloaded")


@dataclass(frozen=True)
class Hooks:
    """What the registry reports (service/metrics.py records it): a load's pairs and seconds, an unload's pairs."""

    loaded: Callable[[list[Pair], float], object] = lambda pairs, seconds: None
    unloaded: Callable[[list[Pair]], object] = lambda pairs: None


@dataclass(eq=False)
class Slot(Generic[E]):
    """One bundle's place: its pairs' engines once loaded, the load in progress, the requests using it, when last
    used."""

    bundle: Bundle
    footprint: int  # bytes counted against the bound (0 without one)
    engine: Mapping[Pair, E] | None = None
    loading: asyncio.Future[Mapping[Pair, E]] | None = None
    in_flight: int = 0
    used: float = field(default_factory=time.monotonic)
    retired: bool = False  # no longer served: unloaded once no request holds it

    @property
    def state(self) -> State:
        return "loaded" if self.engine is not None else "loading" if self.loading is not None else "unloaded"

    @property
    def held(self) -> bool:
        """Whether it counts against the bound: loaded or loading."""
        return self.state != "unloaded"


class PairRegistry(Generic[E]):
    """The bundles behind the served pairs, loaded on first use under a memory bound.

    Args:
        bundles: the checked bundles; each serves the pairs its manifest names (service/serving/catalog.py).
        load: builds a bundle's engines, started and warm, one for each of its pairs (awaited on the event loop).
        unload: stops a bundle's engines and lets their memory go.
        footprint: the bytes a bundle counts against ``bound`` once loaded (asked only under a bound).
        bound: bytes the loaded bundles' footprints may add up to; 0 = no bound.
        hooks: where loads and unloads are reported.
    """

    def __init__(
        self,
        bundles: Sequence[Bundle],
        load: Callable[[Bundle], Awaitable[Mapping[Pair, E]]],
        unload: Callable[[Mapping[Pair, E]], Awaitable[None]],
        footprint: Callable[[Bundle], int],
        bound: int = 0,
        hooks: Hooks | None = None,
    ) -> None:
        self._load, self._unload, self._footprint, self.bound = load, unload, footprint, bound
        self.hooks = hooks or Hooks()
        self.slots = [Slot[E](b, self._size(b)) for b in bundles]
        self._by_pair = {pair: slot for slot in self.slots for pair in pairs_of(slot.bundle.manifest)}
        self._unloading: set[asyncio.Task[None]] = set()
        self._started = False  # preload done: later load failures are logged here

    def stage(self, bundles: Sequence[Bundle]) -> None:
        """Add slots for ``bundles`` not registered yet, serving no pair until :meth:`serve` names them (so that
        :meth:`preload` can warm them first)."""
        have = {id(s.bundle) for s in self.slots}
        self.slots += [Slot[E](b, self._size(b)) for b in bundles if id(b) not in have]

    def serve(self, bundles: Sequence[Bundle]) -> None:
        """Serve exactly ``bundles``' pairs from now on (each pair from the first that names it), staging the new
        ones; every other bundle is retired: out of the pairs at once, unloaded once no request holds it."""
        self.stage(bundles)
        wanted = {id(b) for b in bundles}
        by_pair: dict[Pair, Slot[E]] = {}
        for slot in self.slots:
            if id(slot.bundle) in wanted:
                for pair in pairs_of(slot.bundle.manifest):
                    by_pair.setdefault(pair, slot)
        self._by_pair = by_pair
        for slot in [s for s in self.slots if id(s.bundle) not in wanted]:
            slot.retired = True
            if not slot.in_flight:
                self._retire(slot)

    def drop(self, bundle: Bundle) -> None:
        """Retire a staged bundle that will not be served (its load failed)."""
        for slot in [s for s in self.slots if s.bundle is bundle]:
            slot.retired = True
            self._retire(slot)

    def _retire(self, slot: Slot[E]) -> None:
        """Take a retired slot with no request in flight out, its engines unloaded (or its load cancelled)."""
        self.slots.remove(slot)
        if slot.loading is not None:
            slot.loading.cancel()
        if slot.engine is not None:
            engine, slot.engine = slot.engine, None
            log.info("unloading %s (no longer served)", slot.bundle.name)
            task = asyncio.ensure_future(self._unload(engine))
            self._unloading.add(task)
            task.add_done_callback(partial(self._unloaded, list(engine)))

    def _size(self, bundle: Bundle) -> int:
        return self._footprint(bundle) if self.bound else 0  # reading graphs' headers costs start-up time

    @property
    def pairs(self) -> list[Pair]:
        """Every pair a bundle serves, loaded or not."""
        return list(self._by_pair)

    def bundle(self, pair: Pair) -> Bundle:
        """The bundle that serves ``pair``.

        Raises:
            UnknownPair: no bundle serves it.
        """
        return self._slot(pair).bundle

    def pair_states(self) -> dict[str, int]:
        """How many pairs are in each state of :data:`STATES` (their bundle's)."""
        counts: dict[str, int] = dict.fromkeys(STATES, 0)
        for slot in self._by_pair.values():
            counts[slot.state] += 1
        return counts

    def engines(self) -> list[E]:
        """Each loaded bundle's first engine (its other pairs' engines share its schedulers)."""
        return [next(iter(s.engine.values())) for s in self.slots if s.engine is not None]

    def loaded(self) -> list[Bundle]:
        """The loaded bundles."""
        return [s.bundle for s in self.slots if s.engine is not None]

    async def preload(self, bundles: Sequence[Bundle]) -> None:
        """Load ``bundles`` now, in order, each while it fits in the bound beside those before it (start-up: the
        server is ready once they are warm); the others load on first use."""
        for bundle in bundles:
            slot = next(s for s in self.slots if s.bundle is bundle)
            if slot.engine is not None or (self.bound and self._held_bytes() + slot.footprint > self.bound):
                continue
            await self._engine(slot)
        self._started = True

    @asynccontextmanager
    async def use(self, pair: Pair) -> AsyncIterator[E]:
        """The engine of ``pair``, its bundle loaded first if it is not, and kept loaded while the caller uses it.

        Raises:
            UnknownPair: no bundle serves ``pair``.
            ModelsBusy: the bound leaves no room for it, and every loaded bundle has requests in flight.
            PairUnavailable: its load failed.
        """
        slot = self._slot(pair)
        slot.in_flight += 1  # before any wait: a slot in use is never unloaded
        try:
            engines = slot.engine if slot.engine is not None else await self._engine(slot)
            slot.used = time.monotonic()
            yield engines[pair]
        finally:
            slot.in_flight -= 1
            slot.used = time.monotonic()
            if slot.retired and not slot.in_flight and slot in self.slots:
                self._retire(slot)

    async def close(self) -> None:
        """Stop every engine (the lifespan's end): loads in progress are cancelled, unloads awaited."""
        for slot in self.slots:
            if slot.loading is not None:
                slot.loading.cancel()
        if self._unloading:
            await asyncio.gather(*self._unloading, return_exceptions=True)
        for slot in self.slots:
            if slot.engine is not None:
                engine, slot.engine = slot.engine, None
                await self._unload(engine)

    def _slot(self, pair: Pair) -> Slot[E]:
        if pair not in self._by_pair:
            pairs = ", ".join(f"{s}→{t}" for s, t in self._by_pair)
            raise UnknownPair(f"no model translates {pair[0]}→{pair[1]}; this server serves {pairs} (GET /languages)")
        return self._by_pair[pair]

    def _held_bytes(self) -> int:
        return sum(s.footprint for s in self.slots if s.held)

    async def _engine(self, slot: Slot[E]) -> Mapping[Pair, E]:
        """The slot's engines, from the load in progress or one started now (after making room for it)."""
        if slot.loading is None:
            self._make_room(slot)
            slot.loading = asyncio.ensure_future(self._loaded(slot, list(self._unloading)))
        return await asyncio.shield(slot.loading)  # a caller that goes away leaves the load to the others

    def _make_room(self, slot: Slot[E]) -> None:
        """Unload the least recently used idle bundles until ``slot`` fits in the bound (synchronous, so that two
        loads never count the same room).

        Raises:
            ModelsBusy: the idle bundles do not free enough.
        """
        if not self.bound:
            return
        need = self._held_bytes() + slot.footprint - self.bound
        idle = sorted((s for s in self.slots if s.engine is not None and not s.in_flight), key=lambda s: s.used)
        if need > sum(s.footprint for s in idle):
            raise ModelsBusy(
                f"the model for {'→'.join(pairs_of(slot.bundle.manifest)[0])} is not loaded, and the models loaded "
                "all have requests in flight within models_memory_mb; retry shortly"
            )
        for victim in idle:
            if need <= 0:
                break
            need -= victim.footprint
            engine, victim.engine = victim.engine, None
            assert engine is not None
            log.info("unloading %s (least recently used) to load %s", victim.bundle.name, slot.bundle.name)
            task = asyncio.ensure_future(self._unload(engine))
            self._unloading.add(task)
            task.add_done_callback(partial(self._unloaded, list(engine)))

    def _unloaded(self, pairs: list[Pair], task: asyncio.Task[None]) -> None:
        self._unloading.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("unloading a model failed: %s", task.exception())
        self.hooks.unloaded(pairs)

    async def _loaded(self, slot: Slot[E], unloading: list[asyncio.Task[None]]) -> Mapping[Pair, E]:
        """Load the slot's bundle once the unloads that made room for it are done.

        Raises:
            PairUnavailable: the load failed (logged; the next request tries again).
        """
        start = time.monotonic()
        try:
            if unloading:
                await asyncio.gather(*unloading, return_exceptions=True)
            engine = await self._load(slot.bundle)
        except Exception as e:
            if self._started:  # at start-up the caller reports it (service/http/app.py)
                log.error("loading %s failed: %s: %s", slot.bundle.name, type(e).__name__, " ".join(str(e).split()))
            pairs = ", ".join("→".join(p) for p in pairs_of(slot.bundle.manifest))
            raise PairUnavailable(f"the model for {pairs} failed to load ({type(e).__name__}); retry later") from e
        finally:
            slot.loading = None
        slot.engine = engine
        seconds = time.monotonic() - start
        self.hooks.loaded(list(engine), seconds)
        log.info("loaded %s in %.2f s", slot.bundle.name, seconds)
        return engine
