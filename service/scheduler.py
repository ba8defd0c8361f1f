"""The batching loop: a bounded queue of texts feeds a :class:`~service.decoding.BatchDecoder`, one step at a time.

Plain asyncio; it knows nothing of HTTP or ONNX. Each queued entry has its own future (reply channel) and deadline.
Between two decoding steps, finished texts leave and waiting ones join (iteration-level batching) as long as the
batch stays within ``max_batch_size`` rows and ``max_batch_tokens`` padded source tokens. Decoding runs on one
worker thread, so the event loop keeps serving. The loop reports plain :class:`StepStats`; service/metrics.py turns
them into Prometheus metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

from service.decoding import BatchDecoder, DecodeRequest, DecodeResult

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue cannot take the texts now; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class DeadlineExceeded(Exception):
    """The request's deadline passed before its translation was done."""


@dataclass(frozen=True)
class StepStats:
    """What one iteration of the loop did."""

    rows: int  # hypotheses decoded in this step
    admitted: int  # texts that joined before it
    batch_tokens: int  # padded source tokens held by the batch
    encode_seconds: float
    decode_seconds: float
    generated_tokens: int
    queue_depth: int
    queue_waits: list[float] = field(default_factory=list)  # seconds each admitted text waited


@dataclass
class _Entry:
    key: int
    request: DecodeRequest
    future: asyncio.Future[DecodeResult]
    deadline: float  # loop.time()
    enqueued: float

    @property
    def rows(self) -> int:
        return 1 if self.request.forced is not None else self.request.beam_size


class Scheduler:
    """Owns one bundle's decoder. Start with :meth:`start`, stop with :meth:`stop`, submit with :meth:`submit`."""

    def __init__(
        self,
        decoder: BatchDecoder,
        *,
        max_batch_size: int = 32,
        max_batch_tokens: int = 8192,
        max_wait_ms: float = 5.0,
        queue_size: int = 256,
        continuous: bool = True,
        on_step: Callable[[StepStats], None] | None = None,
    ) -> None:
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000
        self.queue_size = queue_size
        self.continuous = continuous
        self.on_step = on_step or (lambda _: None)
        self._queue: deque[_Entry] = deque()
        self._active: dict[int, _Entry] = {}
        self._ids = itertools.count()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="attnserve-decode")
        self._task: asyncio.Task[None] | None = None
        self._step_seconds = 0.05  # running mean, for Retry-After

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def active_sequences(self) -> int:
        return self.decoder.num_rows

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="attnserve-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for entry in [*self._queue, *self._active.values()]:
            if not entry.future.done():
                entry.future.set_exception(DeadlineExceeded("the server is shutting down"))
        self._executor.shutdown(wait=True)

    def submit_many(self, requests: list[DecodeRequest], timeout: float) -> list[asyncio.Future[DecodeResult]]:
        """Queue texts all together or not at all.

        Raises:
            QueueFull: fewer than ``len(requests)`` places are free.
        """
        if len(self._queue) + len(requests) > self.queue_size:
            raise QueueFull(self.retry_after())
        loop = asyncio.get_running_loop()
        now = loop.time()
        futures = []
        for r in requests:
            entry = _Entry(next(self._ids), r, loop.create_future(), now + timeout, now)
            self._queue.append(entry)
            futures.append(entry.future)
        self._wakeup.set()
        return futures

    def retry_after(self) -> int:
        """Seconds until the queue has drained about one batch, at least 1."""
        steps_per_text = 20
        return max(1, round(len(self._queue) / self.max_batch_size * steps_per_text * self._step_seconds))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue and not self._active:
                self._wakeup.clear()
                await self._wakeup.wait()
            if not self._active and len(self._queue) < self.max_batch_size and self.max_wait > 0:
                await asyncio.sleep(self.max_wait)  # let a batch form
            self._expire(loop.time())
            admitted = self._take() if (self.continuous or not self._active) else []
            if not admitted and not self._active:
                continue  # everything waiting was cancelled or expired
            try:
                stats = await loop.run_in_executor(self._executor, self._iterate, admitted, loop.time(), loop)
            except Exception as e:  # a runner failure fails the texts it was decoding, never the loop
                log.exception("decoding failed")
                for entry in [*admitted, *self._active.values()]:
                    if not entry.future.done():
                        entry.future.set_exception(e)
                self._active.clear()
                self.decoder.reset()
                continue
            self.on_step(stats)

    def _take(self) -> list[_Entry]:
        """Waiting texts that fit into the batch, oldest first; sorted by length for the encoder call."""
        rows = self.decoder.num_rows
        S = self.decoder.encoder_mask.shape[1]
        taken: list[_Entry] = []
        while self._queue:
            entry = self._queue[0]
            if entry.future.done():  # cancelled or expired while waiting
                self._queue.popleft()
                continue
            new_rows, new_S = rows + entry.rows, max(S, len(entry.request.src))
            fits = new_rows <= self.max_batch_size and new_rows * new_S <= self.max_batch_tokens
            if not fits and (rows or taken):
                break
            taken.append(self._queue.popleft())
            rows, S = new_rows, new_S
        taken.sort(key=lambda e: len(e.request.src))
        return taken

    def _expire(self, now: float) -> None:
        """Fail texts whose deadline passed; drop rows whose caller went away."""
        for entry in list(self._queue):
            if not entry.future.done() and now > entry.deadline:
                entry.future.set_exception(DeadlineExceeded(f"the deadline passed after {now - entry.enqueued:.1f} s"))
        for key, entry in list(self._active.items()):
            if not entry.future.done() and now > entry.deadline:
                entry.future.set_exception(DeadlineExceeded(f"the deadline passed after {now - entry.enqueued:.1f} s"))
            if entry.future.done():
                self.decoder.cancel(key)
                del self._active[key]

    def _iterate(self, admitted: list[_Entry], now: float, loop: asyncio.AbstractEventLoop) -> StepStats:
        """Runs on the worker thread: admit, one step, hand finished results back to the loop."""
        encode_seconds = self.decoder.admit([(e.key, e.request) for e in admitted])
        for e in admitted:
            self._active[e.key] = e
        rows = self.decoder.num_rows
        batch_tokens = rows * self.decoder.encoder_mask.shape[1]
        done, decode_seconds = self.decoder.step()
        for key, result in done:
            entry = self._active.pop(cast(int, key))
            loop.call_soon_threadsafe(_resolve, entry.future, result)
        self._step_seconds = 0.9 * self._step_seconds + 0.1 * (encode_seconds + decode_seconds)
        return StepStats(
            rows=rows,
            admitted=len(admitted),
            batch_tokens=batch_tokens,
            encode_seconds=encode_seconds,
            decode_seconds=decode_seconds,
            generated_tokens=rows,  # one token per row and step, every beam hypothesis counted
            queue_depth=len(self._queue),
            queue_waits=[now - e.enqueued for e in admitted],
        )


def _resolve(future: asyncio.Future[DecodeResult], result: DecodeResult) -> None:
    if not future.done():
        future.set_result(result)
