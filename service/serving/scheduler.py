"""The batching loop: a bounded queue of texts feeds a decoder (:class:`Decoder`), one step at a time.

It knows nothing of HTTP or ONNX. Each queued entry has its own asyncio future (reply channel) and deadline.
Between two decoding steps, finished texts leave and waiting ones join (iteration-level batching) as long as the
batch stays within ``max_batch_size`` rows and ``max_batch_tokens`` padded source tokens. While the batch is full,
texts that will join in later steps are encoded ahead, with those that join now: one encoder call for many texts
costs less a text than many calls for a few (``encode_ahead``). The loop runs on a thread
of its own, so the event loop keeps serving and a step never waits for the event loop. The loop reports plain
:class:`StepStats`; service/metrics.py turns them into Prometheus metrics.

Admission is fair between requests. A *small* request, one whose texts all fit in ``small_share`` of the batch
(rows and padded tokens), waits in a FIFO lane that may fill the whole batch. A *large* request's texts join in
turn with the other large requests' (one text each, round robin) and never fill that last share: rows of large
requests decode for hundreds of steps, and a small request that had to wait for one to finish would wait as long.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, cast

from service.decoding import DecodeRequest, DecodeResult
from service.errors import TooLarge
from service.serving.core_sharing import WhileSaturated

log = logging.getLogger(__name__)


class Decoder(Protocol):
    """What the scheduler needs from a decoder (:class:`~service.decoding.BatchDecoder`)."""

    @property
    def num_rows(self) -> int: ...  # rows that decode a request

    def source_tokens(self, rows: int = 0, S: int = 0) -> int:
        """Padded source tokens the batch holds, with ``rows`` more rows of ``S`` tokens."""
        ...

    def encode(self, requests: list[tuple[Hashable, DecodeRequest]]) -> float:
        """Encode requests that :meth:`join` adds later; returns the encoder seconds."""
        ...

    def join(self, keys: list[Hashable]) -> None:
        """Add the rows of requests encoded before."""
        ...

    def cancel(self, key: Hashable) -> None:
        """Drop a request's rows (or the request, when it was only encoded)."""
        ...

    def step(self) -> tuple[list[tuple[Hashable, DecodeResult]], float]:
        """One decoding step; the requests that finished and the decoder seconds."""
        ...

    def reset(self) -> None:
        """Forget every row and every request encoded ahead (after a failure)."""
        ...


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
    queue_depth: int
    queue_waits: list[tuple[str, float]] = field(default_factory=list)  # each admitted text's pair, seconds waited
    pair_rows: dict[str, int] = field(default_factory=dict)  # ``rows`` by the pair of their texts


@dataclass
class _Entry:
    key: int
    request: DecodeRequest
    future: asyncio.Future[DecodeResult]
    deadline: float  # time.monotonic()
    enqueued: float
    pair: str = ""  # the label its texts count under (service/metrics.py)
    large: bool = False  # of a large request: joins round robin, never into the batch's small share
    failed: bool = False  # the decoding thread has failed it (the future learns it on the event loop)

    @property
    def rows(self) -> int:
        return 1 if self.request.forced is not None else self.request.beam_size

    @property
    def gone(self) -> bool:
        """Answered, failed, or cancelled by its caller: nothing more to decode for it."""
        return self.failed or self.future.done()


class Scheduler:
    """Owns a decoder (one batching loop of a runner). Start with :meth:`start`, stop with :meth:`stop`, submit with
    :meth:`submit_many`.

    The event loop only queues texts and receives answers; the batching loop runs on its own thread, so a step
    never waits for the event loop to schedule it (under load the loop is busy with HTTP). Every future is set on
    the event loop (``call_soon_threadsafe``); ``on_step`` is called on the decoding thread, and ``saturation`` hears
    how many rows the batch holds after each step.
    """

    def __init__(
        self,
        decoder: Decoder,
        *,
        max_batch_size: int = 32,
        max_batch_tokens: int = 8192,
        max_wait_ms: float = 5.0,
        queue_size: int = 1024,
        continuous: bool = True,
        encode_ahead: int = 16,
        small_share: float = 0.125,
        on_step: Callable[[StepStats], None] | None = None,
        saturation: WhileSaturated | None = None,
    ) -> None:
        self.decoder = decoder
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000
        self.queue_size = queue_size
        self.continuous = continuous
        self.encode_ahead = encode_ahead if continuous else 0
        self.on_step = on_step or (lambda _: None)
        self.saturation = saturation
        self.small_rows = int(max_batch_size * small_share)
        self.small_tokens = int(max_batch_tokens * small_share)
        self._queue: deque[_Entry] = deque()  # small requests' texts, appended on the event loop
        self._incoming: deque[deque[_Entry]] = deque()  # large requests, appended on the event loop
        self._large: deque[deque[_Entry]] = deque()  # the decoding thread's: large requests in turn, texts waiting
        self._large_queued = 0  # texts of large requests queued (written on the event loop only)
        self._large_taken = 0  # and taken from the queue (written on the decoding thread only)
        self._ready: deque[_Entry] = deque()  # taken from the queue and encoded ahead; they join before the queue's
        self._active: dict[int, _Entry] = {}  # the decoding thread's
        self._finished: list[tuple[_Entry, DecodeResult]] = []  # answered before the next step (_settle_finished)
        self._ids = itertools.count()
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_seconds = 0.05  # running mean, for Retry-After

    @property
    def queue_depth(self) -> int:
        """Texts waiting for rows (those encoded ahead too)."""
        return len(self._queue) + len(self._ready) + self._large_queued - self._large_taken

    @property
    def active_sequences(self) -> int:
        return self.decoder.num_rows

    def queued_by_pair(self) -> Counter[str]:
        """:attr:`queue_depth` by pair, read off the decoding thread: each container is copied in one call, which
        the GIL does not interrupt, so a text moving between two of them may count twice or not at all."""
        waiting = [*list(self._queue), *list(self._ready)]
        for group in [*list(self._incoming), *list(self._large)]:
            waiting += list(group)
        return Counter(e.pair for e in waiting)

    def rows_by_pair(self) -> Counter[str]:
        """:attr:`active_sequences` by pair, read off the decoding thread (the rows of the texts decoding)."""
        rows: Counter[str] = Counter()
        for e in list(self._active.values()):
            rows[e.pair] += e.rows
        return rows

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="attnserve-decode", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self.saturation is not None:
            self.saturation.observe(self, 0)  # its rows are gone: the policy must not outlive the loop
        for entry, result in self._finished:
            _settle(entry.future, result)
        large = [e for group in (*self._incoming, *self._large) for e in group]
        for entry in [*self._queue, *large, *self._ready, *self._active.values()]:
            _settle(entry.future, DeadlineExceeded("the server is shutting down"))

    def submit_many(
        self, requests: list[DecodeRequest], timeout: float, arrival: float | None = None, pair: str = ""
    ) -> list[asyncio.Future[DecodeResult]]:
        """Queue texts all together or not at all (on the event loop); their deadline is ``timeout`` seconds after
        ``arrival`` (``time.monotonic()``; default now); :class:`StepStats` counts them under ``pair``.

        Raises:
            TooLarge: more texts than the queue holds (``queue_size``): they could never be queued.
            QueueFull: fewer than ``len(requests)`` places are free.
        """
        if len(requests) > self.queue_size:
            raise TooLarge(
                f"the request has {len(requests)} texts; the queue holds queue_size={self.queue_size}",
                "queue_size",
                self.queue_size,
            )
        if self.queue_depth + len(requests) > self.queue_size:
            raise QueueFull(self.retry_after())
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        deadline = (now if arrival is None else arrival) + timeout
        large = not self._small(requests)
        entries = [_Entry(next(self._ids), r, loop.create_future(), deadline, now, pair, large) for r in requests]
        if large:
            self._large_queued += len(entries)
            self._incoming.append(deque(entries))
        else:
            self._queue.extend(entries)
        self._wakeup.set()
        return [e.future for e in entries]

    def _small(self, requests: list[DecodeRequest]) -> bool:
        """Whether the texts fit in the batch's small share all together (rows and padded source tokens)."""
        rows = sum(1 if r.forced is not None else r.beam_size for r in requests)
        return rows <= self.small_rows and rows * max(len(r.src) for r in requests) <= self.small_tokens

    def retry_after(self) -> int:
        """Seconds until the queue has drained about one batch, at least 1."""
        steps_per_text = 20
        return max(1, round(self.queue_depth / self.max_batch_size * steps_per_text * self._step_seconds))

    def _run(self) -> None:
        """The batching loop, on the decoding thread: admit, step, answer, until :meth:`stop`."""
        while not self._stopping:
            if not self._active and not self._queue and not self._ready and not self._incoming and not self._large:
                self._settle_finished()
                self._wakeup.wait()
                self._wakeup.clear()
                continue
            if not self._active and len(self._queue) < self.max_batch_size and self.max_wait > 0:
                self._settle_finished()
                time.sleep(self.max_wait)  # let a batch form
            admitted: list[_Entry] = []
            encoded: list[_Entry] = []
            try:
                self._expire(time.monotonic())
                if self.continuous or not self._active:
                    admitted, encoded = self._take()
                if not admitted and not self._active:
                    self._settle_finished()
                    continue  # everything waiting was cancelled or expired
                stats = self._iterate(admitted, encoded)
            except Exception as e:  # a failure fails the texts it was decoding, never the loop
                log.exception("decoding failed")
                self._settle_finished()  # those were done before it
                for entry in [*admitted, *self._ready, *self._active.values()]:  # encoded: in one of these
                    self._answer(entry, e)
                self._active.clear()
                self._ready.clear()
                self.decoder.reset()
                continue
            self.on_step(stats)
            if self.saturation is not None:
                self.saturation.observe(self, self.decoder.num_rows)

    def _settle_finished(self) -> None:
        """Answer the texts the last step finished. The loop does so just before its next ONNX Runtime call (or
        wait), not at once: the event loop then sends the answers while the model runs without the GIL, instead of
        taking the GIL while this thread moves the newcomers' caches (numpy lets it go for each large copy and waits
        to get it back). One call for them all: the event loop wakes once a step, not once a text."""
        if self._finished:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(_settle_all, [(entry.future, result) for entry, result in self._finished])
        self._finished = []

    def _answer(self, entry: _Entry, outcome: DecodeResult | Exception) -> None:
        """Hand a result or an exception to the entry's caller, on the event loop."""
        assert self._loop is not None
        entry.failed = isinstance(outcome, Exception)
        self._loop.call_soon_threadsafe(_settle, entry.future, outcome)

    def _take(self) -> tuple[list[_Entry], list[_Entry]]:
        """The texts that join the batch now, and those to encode now (sorted by length for the encoder call).

        Those encoded ahead join first, then small requests' texts oldest first, then large requests' in turn, each
        lane as long as its texts fit (a large request's within the batch less its small share). When some join and
        the batch is then full, up to ``encode_ahead`` rows more are encoded ahead, in the same order."""
        while self._incoming:
            self._large.append(self._incoming.popleft())
        joining = _Joining(self)
        full = self._take_from(self._ready, joining)
        ready = len(joining.taken)
        full = self._take_from(self._queue, joining) or full
        while (head := self._large_head()) is not None:
            if not joining.fits(head):
                full = True
                break
            joining.add(self._pop_large())
        taken = joining.taken
        encode = taken[ready:]
        if encode and full:
            self._encode_ahead(encode)
        encode.sort(key=lambda e: len(e.request.src))
        return taken, encode

    def _take_from(self, waiting: deque[_Entry], joining: _Joining) -> bool:
        """Move texts from the head of ``waiting`` to ``joining`` while they fit; whether one did not."""
        while waiting:
            entry = waiting[0]
            if entry.gone:  # cancelled or expired while waiting
                waiting.popleft()
                if waiting is self._ready:
                    self.decoder.cancel(entry.key)
                continue
            if not joining.fits(entry):
                return True
            joining.add(waiting.popleft())
        return False

    def _large_head(self) -> _Entry | None:
        """The next text of the large request whose turn it is (requests with nothing left are dropped)."""
        large = self._large
        while large:
            group = large[0]
            while group and group[0].gone:
                group.popleft()
                self._large_taken += 1
            if group:
                return group[0]
            large.popleft()
        return None

    def _pop_large(self) -> _Entry:
        """Take :meth:`_large_head`; the next large request's turn comes."""
        entry = self._large[0].popleft()
        self._large_taken += 1
        self._large.rotate(-1)
        return entry

    def _encode_ahead(self, encode: list[_Entry]) -> None:
        """Move up to ``encode_ahead`` rows' worth of queued texts (with those encoded before) to ``_ready``."""
        ahead = sum(e.rows for e in self._ready)
        while self._queue and ahead + self._queue[0].rows <= self.encode_ahead:
            if not (entry := self._queue.popleft()).gone:
                self._ready.append(entry)
                encode.append(entry)
                ahead += entry.rows
        while (head := self._large_head()) is not None and ahead + head.rows <= self.encode_ahead:
            entry = self._pop_large()
            self._ready.append(entry)
            encode.append(entry)
            ahead += entry.rows

    def _expire(self, now: float) -> None:
        """Fail texts whose deadline passed; drop rows whose caller went away.

        The small lane is looked at from its oldest text up to the first one still waiting within its deadline:
        deadlines come in the queue's order when every caller gives the same timeout (the service's
        ``request_timeout_s``). Checking every queued text at every step would make a long queue cost the decoding
        thread (holding the GIL) more the longer it grew. A large request's texts share one deadline: its first
        waiting text stands for them all."""
        queue = self._queue
        while queue and (queue[0].gone or now > queue[0].deadline):
            self._fail_expired(queue.popleft(), now)
        while self._incoming:
            self._large.append(self._incoming.popleft())
        for group in self._large:
            while group and (group[0].gone or now > group[0].deadline):
                self._large_taken += 1
                self._fail_expired(group.popleft(), now)
        for entry in [*self._ready, *self._active.values()]:
            if not entry.gone and now > entry.deadline:
                self._fail_expired(entry, now)
        for entry in [entry for entry in self._ready if entry.gone]:
            self.decoder.cancel(entry.key)
            self._ready.remove(entry)
        for key, entry in list(self._active.items()):
            if entry.gone:
                self.decoder.cancel(key)
                del self._active[key]

    def _fail_expired(self, entry: _Entry, now: float) -> None:
        if not entry.gone:
            self._answer(entry, DeadlineExceeded(f"the deadline passed after {now - entry.enqueued:.1f} s"))

    def _iterate(self, admitted: list[_Entry], encoded: list[_Entry]) -> StepStats:
        """Encode, admit, one step, hand finished results back to the event loop."""
        now = time.monotonic()
        if encoded:
            self._settle_finished()  # sent while the encoder runs
        encode_seconds = self.decoder.encode([(e.key, e.request) for e in encoded])
        self.decoder.join([e.key for e in admitted])
        for e in admitted:
            self._active[e.key] = e
        rows = self.decoder.num_rows
        pair_rows = self.rows_by_pair()
        batch_tokens = self.decoder.source_tokens()
        self._settle_finished()
        done, decode_seconds = self.decoder.step()
        self._finished = [(self._active.pop(cast(int, key)), result) for key, result in done]
        self._step_seconds = 0.9 * self._step_seconds + 0.1 * (encode_seconds + decode_seconds)
        return StepStats(
            rows=rows,
            admitted=len(admitted),
            batch_tokens=batch_tokens,
            encode_seconds=encode_seconds,
            decode_seconds=decode_seconds,
            queue_depth=self.queue_depth,
            queue_waits=[(e.pair, now - e.enqueued) for e in admitted],
            pair_rows=dict(pair_rows),
        )


class _Joining:
    """The texts joining the batch in one :meth:`Scheduler._take`, and whether one more fits."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.held = scheduler.decoder.num_rows
        self.taken: list[_Entry] = []
        self.rows, self.S = 0, 0

    def fits(self, entry: _Entry) -> bool:
        """Whether ``entry`` fits too: within the batch's limits, a large request's less the small share. An
        empty batch takes any one text."""
        if not self.held and not self.taken:
            return True
        s = self.scheduler
        rows, S = self.rows + entry.rows, max(self.S, len(entry.request.src))
        max_rows, max_tokens = s.max_batch_size, s.max_batch_tokens
        if entry.large:
            max_rows, max_tokens = max_rows - s.small_rows, max_tokens - s.small_tokens
        return self.held + rows <= max_rows and s.decoder.source_tokens(rows, S) <= max_tokens

    def add(self, entry: _Entry) -> None:
        self.taken.append(entry)
        self.rows, self.S = self.rows + entry.rows, max(self.S, len(entry.request.src))


def _settle_all(outcomes: list[tuple[asyncio.Future[DecodeResult], DecodeResult]]) -> None:
    for future, outcome in outcomes:
        _settle(future, outcome)


def _settle(future: asyncio.Future[DecodeResult], outcome: DecodeResult | Exception) -> None:
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
