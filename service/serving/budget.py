"""The in-flight memory budget: what requests hold from the moment they are queued until their answer is built.

The batch limits (``max_batch_size``, ``max_batch_tokens``) bound the caches of the rows being decoded; they do not
bound what a request keeps for its whole life. Attention weights collected step by step for /attention (and for
``return_details``) grow with every text's source × target length, and are held until the answer is built. A
request takes its estimated bytes (:func:`request_bytes`) from a :class:`Budget` before it is queued, and gives them
back once the engine has its answer; one over the budget waits, oldest first, until its deadline, then is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

from service.decoding import DecodeRequest
from service.errors import TooLarge
from service.runtime.bundle import ModelSpec
from service.serving.scheduler import QueueFull

MiB = 1 << 20
IDLE_S = 1.0  # seconds with nothing held before ``trim``


class AttentionFilter(Protocol):
    """Which weights an /attention answer holds (the engine's ``Filters``)."""

    @property
    def kinds(self) -> Sequence[str]: ...

    @property
    def layers(self) -> list[int] | None: ...

    @property
    def heads(self) -> list[int] | None: ...


class BudgetFull(QueueFull):
    """The in-flight memory budget stayed in use until the request's deadline; retry after ``retry_after`` s."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(retry_after)
        self.args = (f"the memory for requests in flight is in use; retry in {retry_after} s",)


def attention_cells(spec: ModelSpec, S: int, T: int) -> int:
    """Attention weights of one hypothesis of ``T`` steps over ``S`` source tokens (self and cross, all layers and
    heads), the most a decoded row collects."""
    return spec.n_decoder_layers * spec.h * T * (S + T)


def request_bytes(request: DecodeRequest, spec: ModelSpec) -> int:
    """What a text holds in flight, at most: its hypotheses' tokens and scores; with attention, the encoder's
    weights and those of its live hypotheses and of the ones it keeps, float32."""
    rows = 1 if request.forced is not None else request.beam_size
    T = len(request.forced) if request.forced is not None else request.max_length
    S = len(request.src)
    held = 8 * rows * (S + T)
    if request.attention:
        kept = max(request.n_best, 1)
        held += 4 * (spec.n_encoder_layers * spec.h * S * S + (rows + kept) * attention_cells(spec, S, T))
    return held


def answer_bytes(spec: ModelSpec, request: DecodeRequest, filters: AttentionFilter) -> int:
    """The /attention answer's weights, float64 ([layer][head][query][key] per kind asked), built before the
    request gives its budget back."""
    T = len(request.forced) if request.forced is not None else request.max_length
    S = len(request.src)
    heads = spec.h if filters.heads is None else len(filters.heads)
    cells = 0
    for kind in set(filters.kinds):
        layers = spec.n_encoder_layers if kind == "encoder" else spec.n_decoder_layers
        layers = layers if filters.layers is None else len(filters.layers)
        cells += layers * heads * {"encoder": S * S, "decoder": T * T, "cross": T * S}[kind]
    return 8 * cells


@dataclass
class _Waiter:
    size: int
    ready: asyncio.Future[None]


class Budget:
    """Bytes that requests in flight may hold together (on the event loop; not thread-safe).

    Args:
        capacity: the budget in bytes.
        setting: the setting it comes from, named when a request can never fit.
        trim: called on a worker thread once nothing has been held for :data:`IDLE_S`, and under load when a
            hold ends at least ``trim_every_s`` after the last call (the engine hands the heap's free memory back
            to the system: service.runtime.runner.trim_memory). Without the calls under load, the heap keeps the highest
            mark that chance coincidences of large requests ever reached, and resident memory creeps up.
        trim_every_s: the least time between two calls under load; 0: only when idle.
    """

    def __init__(
        self,
        capacity: int,
        setting: str = "memory_budget_mb",
        trim: Callable[[], object] | None = None,
        trim_every_s: float = 0.0,
    ) -> None:
        self.capacity = capacity
        self.setting = setting
        self.trim = trim
        self.trim_every_s = trim_every_s
        self.used = 0
        self._emptied = 0.0  # when the last hold ended with nothing else held
        self._trimmed = time.monotonic()  # when ``trim`` was last called
        self._idle_check: asyncio.TimerHandle | None = None
        self._waiters: deque[_Waiter] = deque()
        self._held_seconds = 1.0  # running mean of how long a hold lasts, for Retry-After

    @asynccontextmanager
    async def hold(self, size: int, deadline: float) -> AsyncIterator[None]:
        """Hold ``size`` bytes for the block, waiting (oldest first) until ``deadline`` (``time.monotonic()``).

        Raises:
            TooLarge: ``size`` is over the whole budget: the request could never be served.
            BudgetFull: the deadline came first.
        """
        if size > self.capacity:
            raise TooLarge(
                f"the request would hold about {size / MiB:.0f} MiB in flight; the limit is "
                f"{self.setting}={self.capacity // MiB}: send fewer or shorter texts, a smaller beam_size or "
                "max_length, or fewer attention kinds",
                self.setting,
                self.capacity // MiB,
            )
        if self._waiters or self.used + size > self.capacity:
            await self._wait(size, deadline)
        else:
            self.used += size
        start = time.monotonic()
        try:
            yield
        finally:
            self._held_seconds = 0.9 * self._held_seconds + 0.1 * (time.monotonic() - start)
            self.used -= size
            self._wake()
            if self.trim is not None:
                self._released()

    def _released(self) -> None:
        """After a hold ended: trim now if load has gone on for ``trim_every_s`` since the last trim; with
        nothing held, look again in :data:`IDLE_S`."""
        now = time.monotonic()
        if self.trim_every_s and now - self._trimmed >= self.trim_every_s:
            self._call_trim()
        if not self.used:
            self._emptied = now
            if self._idle_check is None:
                self._idle_check = asyncio.get_running_loop().call_later(IDLE_S, self._when_idle)

    def _when_idle(self) -> None:
        """Call ``trim`` if nothing was held since the budget emptied :data:`IDLE_S` ago; else look again."""
        self._idle_check = None
        if self.used or self._waiters:
            return  # the next hold to end with nothing held looks again
        if (left := self._emptied + IDLE_S - time.monotonic()) > 0:
            self._idle_check = asyncio.get_running_loop().call_later(left, self._when_idle)
        else:
            self._call_trim()

    def _call_trim(self) -> None:
        self._trimmed = time.monotonic()
        if self.trim is not None:
            asyncio.get_running_loop().run_in_executor(None, self.trim)

    async def _wait(self, size: int, deadline: float) -> None:
        waiter = _Waiter(size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.ready), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            if not waiter.ready.done():
                self._waiters.remove(waiter)
                self._wake()  # those behind it may fit
                raise BudgetFull(max(1, round(self._held_seconds))) from None
        except BaseException:  # cancelled (the caller went away): give back what it may have been handed
            if waiter.ready.done():
                self.used -= size
            else:
                self._waiters.remove(waiter)
            self._wake()
            raise

    def _wake(self) -> None:
        """Hand the budget to waiters, oldest first, while they fit."""
        while self._waiters and self.used + self._waiters[0].size <= self.capacity:
            waiter = self._waiters.popleft()
            self.used += waiter.size
            waiter.ready.set_result(None)
