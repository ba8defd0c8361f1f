"""bench/memo_server.py: a scheduler's texts answered from the runner's first result for each, the decoding loop
beside it started once it has a batch of texts."""

from __future__ import annotations

import asyncio
import inspect
import time

from memo_server import BATCH, Memo

from service.decoding import BatchDecoder, DecodeRequest
from service.serving.scheduler import Scheduler
from tests.service.fake_runner import CountingRunner, expected


def test_texts_are_answered_by_the_runners_first_result_for_each() -> None:
    runner = CountingRunner()
    scheduler = Scheduler(BatchDecoder(runner))
    memo = Memo(beside_decoding=False)

    async def submit(sources: list[list[int]]) -> list[list[int]]:
        futures = memo.submit_many(scheduler, [DecodeRequest(src=s, max_length=20) for s in sources], 10.0)
        return [r.hypotheses[0].tokens for r in await asyncio.gather(*futures)]

    sources = [[3, 4, 0], [5, 0], [3, 4, 0]]
    assert asyncio.run(submit(sources)) == [expected(s) for s in sources]
    steps = len(runner.step_rows)
    assert asyncio.run(submit(sources[:2])) == [expected(s) for s in sources[:2]]
    assert len(runner.step_rows) == steps  # answered from the memo
    assert len(memo.results) == 2 and memo.decoding is None


def test_the_decoding_loop_starts_once_a_batch_of_texts_was_answered() -> None:
    runner = CountingRunner()
    scheduler = Scheduler(BatchDecoder(runner))
    memo = Memo(beside_decoding=True)

    async def submit(sources: list[list[int]]) -> None:
        await asyncio.gather(*memo.submit_many(scheduler, [DecodeRequest(src=s) for s in sources], 10.0))

    sources = [[2 + n % 12, 1 + n // 12, 0] for n in range(BATCH)]
    asyncio.run(submit(sources[:-1]))
    assert memo.decoding is None
    try:
        asyncio.run(submit(sources[-1:]))
        assert memo.decoding is not None and memo.decoding.is_alive()
        steps = len(runner.step_rows)
        deadline = time.monotonic() + 10
        while len(runner.step_rows) == steps and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(runner.step_rows) > steps  # decoding with nobody waiting for it
    finally:
        memo.stop()
    assert not memo.decoding.is_alive()


def test_it_takes_what_the_scheduler_takes() -> None:
    """The server calls the memo in Scheduler.submit_many's place, with that method's arguments."""
    ours = list(inspect.signature(Memo.submit_many).parameters.values())
    theirs = list(inspect.signature(Scheduler.submit_many).parameters.values())
    assert [ours[0], *ours[2:]] == theirs
