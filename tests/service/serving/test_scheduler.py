"""The batching loop without a model: a fake runner whose next token depends only on a row's own inputs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable

import numpy as np
import pytest

from service.decoding import BatchDecoder, DecodeRequest
from service.errors import TooLarge
from service.runtime.runner import StepInput, StepOutput
from service.serving.core_sharing import WhileSaturated
from service.serving.scheduler import DeadlineExceeded, QueueFull, Scheduler, StepStats
from tests.service.fake_runner import CountingRunner, expected


async def run(scheduler: Scheduler, requests: list[DecodeRequest], timeout: float = 10) -> list:
    await scheduler.start()
    try:
        return await asyncio.gather(*scheduler.submit_many(requests, timeout), return_exceptions=True)
    finally:
        await scheduler.stop()


def test_continuous_batching_answers_each_caller() -> None:
    runner = CountingRunner()
    stats: list[StepStats] = []
    scheduler = Scheduler(BatchDecoder(runner), max_batch_size=4, max_wait_ms=1, on_step=stats.append)
    srcs = [[i + 2] + [3] * (i % 7) + [0] for i in range(20)]
    results = asyncio.run(run(scheduler, [DecodeRequest(src=s, max_length=20) for s in srcs]))
    assert [r.hypotheses[0].tokens for r in results] == [expected(s) for s in srcs]
    assert max(runner.step_rows) == 4  # the batch limit holds
    assert sum(s.admitted for s in stats) == 20
    # Texts joined while others were decoding: some steps admitted into a non-empty batch.
    assert any(s.admitted and s.rows > s.admitted for s in stats)


def test_token_budget_limits_the_batch() -> None:
    runner = CountingRunner()
    decoder = BatchDecoder(runner)
    scheduler = Scheduler(decoder, max_batch_size=32, max_batch_tokens=20, max_wait_ms=1, small_share=0)
    srcs = [[2] + [3] * 8 + [0] for _ in range(8)]  # 10 tokens each: two rows fit (no share kept for small requests)
    asyncio.run(run(scheduler, [DecodeRequest(src=s, max_length=20) for s in srcs]))
    assert max(runner.step_rows) == 2


def test_queue_full_and_deadline() -> None:
    scheduler = Scheduler(BatchDecoder(CountingRunner()), queue_size=3)

    async def go() -> list:
        waiting = scheduler.submit_many([DecodeRequest(src=[2, 0])] * 2, 10)  # not started: they stay queued
        with pytest.raises(QueueFull) as full:
            scheduler.submit_many([DecodeRequest(src=[2, 0])] * 2, 10)
        assert full.value.retry_after >= 1
        with pytest.raises(TooLarge, match="queue_size=3") as never:  # could never be queued: refused, not retried
            scheduler.submit_many([DecodeRequest(src=[2, 0])] * 4, 10)
        assert (never.value.field, never.value.limit) == ("queue_size", 3)
        await scheduler.start()
        try:
            await asyncio.gather(*waiting)
            return await asyncio.gather(
                *scheduler.submit_many([DecodeRequest(src=[2, 0])], 0.0), return_exceptions=True
            )
        finally:
            await scheduler.stop()

    (result,) = asyncio.run(go())
    assert isinstance(result, DeadlineExceeded)


class SlowRunner(CountingRunner):
    """A millisecond a step: long enough for the event loop to see a request being decoded."""

    def step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.001)
        return super().step(*args, **kwargs)


def test_cancelled_request_frees_its_rows() -> None:
    runner = SlowRunner()
    scheduler = Scheduler(BatchDecoder(runner), max_wait_ms=0)

    async def go() -> int:
        await scheduler.start()
        try:
            long = DecodeRequest(src=[2] + [3] * 60 + [0], max_length=64)
            (future,) = scheduler.submit_many([long], 10)
            while scheduler.active_sequences == 0 and not future.done():
                await asyncio.sleep(0.001)
            future.cancel()
            for _ in range(100):
                if scheduler.active_sequences == 0:
                    break
                await asyncio.sleep(0.005)
            return scheduler.active_sequences
        finally:
            await scheduler.stop()

    assert asyncio.run(go()) == 0
    assert len(runner.step_rows) < 60


def test_request_level_batching_admits_only_into_an_empty_batch() -> None:
    runner = CountingRunner()
    stats: list[StepStats] = []
    scheduler = Scheduler(BatchDecoder(runner), max_batch_size=4, max_wait_ms=1, continuous=False, on_step=stats.append)
    srcs = [[i + 2] + [3] * (i % 7) + [0] for i in range(20)]
    results = asyncio.run(run(scheduler, [DecodeRequest(src=s, max_length=20) for s in srcs]))
    assert [r.hypotheses[0].tokens for r in results] == [expected(s) for s in srcs]
    assert not any(s.admitted and s.rows > s.admitted for s in stats)


class FailingOnceRunner(CountingRunner):
    """Fails the decoder call that meets a source starting with 9, once."""

    failed = False

    def step(self, step: StepInput) -> StepOutput:
        if not self.failed and (step.cross_keys[0][:, 0, 0, 0] == 9).any():
            self.failed = True
            raise RuntimeError("the runner broke")
        return super().step(step)


def test_a_runner_failure_fails_the_batch_and_the_loop_goes_on() -> None:
    scheduler = Scheduler(BatchDecoder(FailingOnceRunner()), max_wait_ms=0)

    async def go() -> tuple[list, list]:
        await scheduler.start()
        try:
            first = await asyncio.gather(
                *scheduler.submit_many([DecodeRequest(src=[9, 3, 0]), DecodeRequest(src=[4, 3, 0])], 10),
                return_exceptions=True,
            )
            after = await asyncio.gather(*scheduler.submit_many([DecodeRequest(src=[5, 3, 3, 0])], 10))
            return first, after
        finally:
            await scheduler.stop()

    first, after = asyncio.run(go())
    assert all(isinstance(r, RuntimeError) for r in first)
    assert after[0].hypotheses[0].tokens == expected([5, 3, 3, 0])
    assert scheduler.active_sequences == 0


class EncodeCountingRunner(CountingRunner):
    """Records the texts of each encoder call."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[int] = []

    def encode(self, input_ids, attention_mask, position_ids):  # type: ignore[no-untyped-def]
        self.encoded.append(len(np.unique(attention_mask[attention_mask > 0])))
        return super().encode(input_ids, attention_mask, position_ids)


@pytest.mark.parametrize("ahead", [0, 8])
def test_texts_encoded_ahead_while_the_batch_is_full_get_their_own_answers(ahead: int) -> None:
    runner = EncodeCountingRunner()
    stats: list[StepStats] = []
    decoder = BatchDecoder(runner)
    scheduler = Scheduler(decoder, max_batch_size=4, max_wait_ms=1, encode_ahead=ahead, on_step=stats.append)
    srcs = [[i % 13 + 2] + [3] * (i % 7) + [0] for i in range(40)]
    results = asyncio.run(run(scheduler, [DecodeRequest(src=s, max_length=20) for s in srcs]))
    assert [r.hypotheses[0].tokens for r in results] == [expected(s) for s in srcs]
    assert max(runner.step_rows) == 4 and sum(runner.encoded) == 40
    assert sum(s.admitted for s in stats) == 40
    if ahead:  # one call encodes the texts that join and up to 8 more, which join in later steps without a call
        assert max(runner.encoded) > 4 and len(runner.encoded) < sum(s.admitted > 0 for s in stats)
    else:
        assert len(runner.encoded) == sum(s.admitted > 0 for s in stats)


def test_a_text_encoded_ahead_and_cancelled_never_joins() -> None:
    decoder = BatchDecoder(CountingRunner())
    requests = [(key, DecodeRequest(src=[key + 2, 3, 3, 0], max_length=8)) for key in range(3)]
    decoder.encode(requests)
    decoder.cancel(1)
    decoder.join([0, 2])
    assert decoder.keys == {0, 2} and decoder.waiting == []
    results: dict = {}
    while decoder.num_rows:
        results.update(decoder.step()[0])
    assert {key: r.hypotheses[0].tokens for key, r in results.items()} == {
        key: expected([key + 2, 3, 3, 0]) for key in (0, 2)
    }


def test_holes_wait_for_newcomers_until_nobody_joins() -> None:
    """A few holes stay for newcomers to fill in place while requests keep joining; once nobody joined for QUIET
    steps, a quarter of holes is compacted away. Newcomers beyond the holes grow the batch (no compaction first)."""
    decoder = BatchDecoder(CountingRunner())
    batch = decoder.young
    lengths = [1, 1, 1, 12, 12, 12, 30, 30]  # tokens each decodes (</s> included)
    decoder.admit([(i, DecodeRequest(src=[2] * (n - 1) + [0], max_length=40)) for i, n in enumerate(lengths)])
    decoder.step()  # three finish: 3 holes of 8, a quarter but fewer than MIN_HOLES, and requests joined a step ago
    assert (len(batch.rows), decoder.num_rows) == (8, 5)
    decoder.admit([(8 + i, DecodeRequest(src=[3] * 29 + [0], max_length=40)) for i in range(5)])  # 3 fill holes, 2 grow
    assert (len(batch.rows), decoder.num_rows) == (10, 10)
    for _ in range(11):  # three finish at 12 tokens: 3 holes of 10, nobody joined for 11 steps (QUIET: 8)
        decoder.step()
    assert (len(batch.rows), decoder.num_rows) == (7, 7)


def test_a_small_request_joins_at_once_while_large_ones_fill_the_batch() -> None:
    """Large requests never fill the small share: a one-text request sent while they decode joins the batch at
    the next step and is answered after about its own length, not after a large request's rows."""
    runner = SlowRunner()
    scheduler = Scheduler(BatchDecoder(runner), max_batch_size=8, max_wait_ms=0, small_share=0.25)
    long = [DecodeRequest(src=[2] + [3] * 40 + [0], max_length=64) for _ in range(24)]  # 41 steps each

    async def go() -> tuple[int, int, list]:
        await scheduler.start()
        try:
            large = scheduler.submit_many(long, 30)
            while scheduler.active_sequences < 6:
                await asyncio.sleep(0.001)
            held = scheduler.active_sequences
            before = len(runner.step_rows)
            (small,) = scheduler.submit_many([DecodeRequest(src=[4, 3, 3, 0], max_length=8)], 30)
            result = await small
            steps = len(runner.step_rows) - before
            assert result.hypotheses[0].tokens == expected([4, 3, 3, 0])
            return held, steps, await asyncio.gather(*large)
        finally:
            await scheduler.stop()

    held, steps, results = asyncio.run(go())
    assert held == 6  # the large request keeps 8 × 0.25 rows free
    assert steps <= 8  # its 4 tokens and a step or two to join; a large row takes 41
    assert [r.hypotheses[0].tokens for r in results] == [expected(r.src) for r in long]


def test_without_a_small_share_the_small_request_waits_for_a_row() -> None:
    """The same flood with small_share=0: the batch is full of large rows, so the small request waits for one to
    finish (the behaviour the share avoids)."""
    runner = SlowRunner()
    scheduler = Scheduler(BatchDecoder(runner), max_batch_size=8, max_wait_ms=0, small_share=0)

    async def go() -> int:
        await scheduler.start()
        try:
            large = scheduler.submit_many([DecodeRequest(src=[2] + [3] * 40 + [0], max_length=64)] * 16, 30)
            while scheduler.active_sequences < 8:
                await asyncio.sleep(0.001)
            before = len(runner.step_rows)
            await scheduler.submit_many([DecodeRequest(src=[4, 3, 3, 0], max_length=8)], 30)[0]
            steps = len(runner.step_rows) - before
            await asyncio.gather(*large)
            return steps
        finally:
            await scheduler.stop()

    assert asyncio.run(go()) > 20


def test_large_requests_take_turns() -> None:
    """Two large requests sent one after the other: their texts join alternately, so the second one's first
    answers come long before the first one's last (FIFO would answer all of the first one first)."""
    scheduler = Scheduler(BatchDecoder(CountingRunner()), max_batch_size=2, max_wait_ms=0, small_share=0)
    order: list[str] = []

    async def go() -> None:
        for name in "AB":
            futures = scheduler.submit_many([DecodeRequest(src=[5, 3, 3, 0], max_length=8)] * 6, 30)
            for f in futures:
                f.add_done_callback(lambda _, name=name: order.append(name))  # type: ignore[misc]
        await scheduler.start()
        try:
            while len(order) < 12:
                await asyncio.sleep(0.001)
        finally:
            await scheduler.stop()

    asyncio.run(go())
    assert order[:4].count("B") == 2 and order.count("A") == 6


def test_the_deadline_counts_from_arrival() -> None:
    """A request that arrived 2 s ago with a 1 s deadline is already late, however briefly it was queued."""
    scheduler = Scheduler(BatchDecoder(SlowRunner()), max_wait_ms=0)

    async def go() -> list:
        await scheduler.start()
        try:
            arrived = time.monotonic() - 2
            late = scheduler.submit_many([DecodeRequest(src=[2, 3, 0])], 1.0, arrived)
            fresh = scheduler.submit_many([DecodeRequest(src=[2, 3, 0])], 1.0)
            return await asyncio.gather(*late, *fresh, return_exceptions=True)
        finally:
            await scheduler.stop()

    late, fresh = asyncio.run(go())
    assert isinstance(late, DeadlineExceeded)
    assert fresh.hypotheses[0].tokens == expected([2, 3, 0])


def test_the_saturation_policy_hears_the_rows_left_after_each_step() -> None:
    heard: list[int] = []

    class Heard(WhileSaturated):
        def observe(self, decoder: Hashable, rows: int) -> None:
            assert decoder is scheduler
            heard.append(rows)

    runner = CountingRunner()
    scheduler = Scheduler(BatchDecoder(runner), max_batch_size=4, max_wait_ms=1, saturation=Heard(4))
    srcs = [[i + 2] + [3] * (2 * i) + [0] for i in range(4)]  # 2, 4, 6 and 8 tokens
    results = asyncio.run(run(scheduler, [DecodeRequest(src=s, max_length=20) for s in srcs]))
    assert [r.hypotheses[0].tokens for r in results] == [expected(s) for s in srcs]
    assert len(heard) == len(runner.step_rows) + 1  # once a step, and 0 rows once the loop has stopped
    assert heard == sorted(heard, reverse=True) and heard[-1] == 0  # texts leave as they finish, none joins late


def test_a_scheduler_stopped_mid_batch_tells_the_saturation_policy_its_rows_are_gone() -> None:
    heard: list[int] = []

    class Heard(WhileSaturated):
        def observe(self, decoder: Hashable, rows: int) -> None:
            heard.append(rows)

    scheduler = Scheduler(BatchDecoder(SlowRunner()), max_batch_size=4, max_wait_ms=0, saturation=Heard(4))

    async def go() -> None:
        await scheduler.start()
        try:
            long = [DecodeRequest(src=[2] + [3] * 60 + [0], max_length=64) for _ in range(4)]
            futures = scheduler.submit_many(long, 10)
            while not any(heard) and not all(f.done() for f in futures):
                await asyncio.sleep(0.001)
        finally:
            await scheduler.stop()

    asyncio.run(go())
    assert any(heard) and heard[-1] == 0  # a stopped loop holds no rows: SCHED_BATCH does not outlive it


def test_texts_count_under_the_pair_they_were_submitted_under() -> None:
    """Two pairs share one scheduler (a multi-target bundle): the queue, the rows and each step's stats by pair add
    up to the totals."""
    stats: list[StepStats] = []
    scheduler = Scheduler(BatchDecoder(CountingRunner()), max_batch_size=4, max_wait_ms=1, on_step=stats.append)
    de = [DecodeRequest(src=[i + 2, 3, 0], max_length=10, beam_size=2) for i in range(3)]
    fr = [DecodeRequest(src=[i + 5, 3, 3, 0], max_length=10) for i in range(5)]

    async def go() -> list:
        futures = scheduler.submit_many(de, 10, pair="en-de") + scheduler.submit_many(fr, 10, pair="en-fr")
        assert scheduler.queued_by_pair() == {"en-de": 3, "en-fr": 5}  # not started: all queued
        assert scheduler.queue_depth == 8 and scheduler.rows_by_pair() == {}
        await scheduler.start()
        try:
            return await asyncio.gather(*futures)
        finally:
            await scheduler.stop()

    asyncio.run(go())
    assert scheduler.queued_by_pair() == {} and scheduler.rows_by_pair() == {}
    assert all(sum(s.pair_rows.values()) == s.rows for s in stats)
    assert {p for s in stats for p in s.pair_rows} == {"en-de", "en-fr"}
    waits = [p for s in stats for p, _ in s.queue_waits]
    assert sorted(waits) == ["en-de"] * 3 + ["en-fr"] * 5
