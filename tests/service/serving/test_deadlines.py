"""Deadlines count from a request's arrival and are kept by the engine itself; requests that could never be served
are refused at once, naming the limit; every request of a flood gets an answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from service.errors import TooLarge
from service.serving.engine import Engine, Runners
from service.serving.scheduler import DeadlineExceeded
from service.serving.translation import Filters, Options
from service.settings import Settings
from tests.service.conftest import ServerFactory
from tests.service.serving.test_engine import Bundle, Runner

OK = {"q": "Hello world.", "source": "en", "target": "ja"}


class StuckRunner(Runner):
    """Each decoding step takes half a second: the decoding thread is busy past a short deadline."""

    attention = True

    def step(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return super().step(*args, **kwargs)


def engine_with(runner: Runner, **settings: Any) -> Engine:
    return Engine(Bundle(), Settings(max_wait_ms=0, **settings), Runners(runner, runner))  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["translate", "attention"])
def test_the_engine_answers_at_the_deadline_while_a_step_is_running(endpoint: str) -> None:
    engine = engine_with(StuckRunner(), request_timeout_s=0.2, decode_rate=1e6)

    async def go() -> float:
        await engine.start()
        try:
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                if endpoint == "translate":
                    await engine.translate(["a b c d e f"], Options())
                else:
                    await engine.attention(["a b c d e f"], Options(), Filters())
            return time.monotonic() - start
        finally:
            await engine.stop()

    assert asyncio.run(go()) < 0.45  # the step in progress takes 0.5 s; the answer does not wait for it


@pytest.mark.parametrize("endpoint", ["translate", "attention"])
def test_the_deadline_counts_from_arrival(endpoint: str) -> None:
    engine = engine_with(Runner(), request_timeout_s=1.0)

    async def go() -> None:
        await engine.start()
        try:
            arrival = time.monotonic() - 1.5  # its body took longer than the deadline to come
            with pytest.raises(DeadlineExceeded):
                if endpoint == "translate":
                    await engine.translate(["a b"], Options(), arrival=arrival)
                else:
                    await engine.attention(["a b"], Options(), Filters(), arrival=arrival)
            assert (await engine.translate(["a b"], Options(), arrival=time.monotonic()))[0].text
        finally:
            await engine.stop()

    asyncio.run(go())


def test_work_the_deadline_cannot_hold_is_refused_before_queueing() -> None:
    engine = engine_with(Runner(), request_timeout_s=2, decode_rate=100)  # 200 generated tokens at most

    async def go() -> None:
        await engine.start()
        try:
            with pytest.raises(TooLarge, match=r"may generate 240 tokens.*decode_rate=100.*limit is 200") as e:
                await engine.translate(["a b c"] * 10, Options(beam_size=2, max_length=12))
            assert (e.value.field, e.value.limit) == ("decode_rate", 200)
            assert not engine.queued_by_pair()
            assert len(await engine.translate(["a b c"] * 10, Options(max_length=12))) == 10  # 120 tokens: served
        finally:
            await engine.stop()

    asyncio.run(go())


def test_unservable_requests_get_413_naming_the_limit(make_server: ServerFactory) -> None:
    server = make_server(queue_size=2, request_timeout_s=5, decode_rate=50)
    with server.client() as c:
        texts = c.post("/translate", json={**OK, "q": ["a", "b", "c"]})
        work = c.post("/translate", json={**OK, "q": ["a", "b"], "beam_size": 8, "max_length": 20})
        attention = c.post("/attention", json={**OK, "beam_size": 8, "max_length": 64})
        fine = c.post("/translate", json={**OK, "q": ["a", "b"]})
    assert texts.status_code == 413 and "queue_size=2" in texts.json()["error"]
    assert work.status_code == 413 and "decode_rate=50" in work.json()["error"]
    assert attention.status_code == 413 and "decode_rate=50" in attention.json()["error"]
    assert fine.status_code == 200


def test_every_request_of_a_flood_is_answered_by_its_deadline(make_server: ServerFactory) -> None:
    """Far more requests than the server decodes in a second, with a one-second deadline: each one is answered,
    200, 503 or 504, and none much later than its deadline."""
    server = make_server(request_timeout_s=1.0, max_batch_size=2, queue_size=64, decode_rate=1e6)
    body = {**OK, "q": "Open the file and save it. " * 5, "beam_size": 4}

    async def flood() -> list[tuple[int, float]]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as c:

            async def one(path: str) -> tuple[int, float]:
                start = time.monotonic()
                r = await c.post(path, json=body)
                return r.status_code, time.monotonic() - start

            return await asyncio.gather(*(one("/attention" if i % 4 == 0 else "/translate") for i in range(160)))

    answers = asyncio.run(flood())
    statuses = {s for s, _ in answers}
    assert statuses <= {200, 503, 504} and 504 in statuses
    assert max(t for _, t in answers) < 2.5  # the deadline, and the time to send what was ready by then
