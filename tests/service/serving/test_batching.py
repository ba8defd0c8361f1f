"""Batching changes no answer, and each answer reaches its own caller."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from service.decoding import BatchDecoder
from tests.service.conftest import Server, ServerFactory

WORDS = "open save file the selected settings delete print window close document replace exists".split()


def number(i: int) -> str:
    """``i`` in words, one a digit: the tiny model's vocabulary has no digits (they would be protected spans)."""
    return " ".join(WORDS[int(d)] for d in str(i))


def mixed_requests(n: int = 64) -> list[dict]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.choice([1, 2, 3, 6, 12, 20])))
        out.append(
            {
                "q": f"{text} {number(i)}",
                "source": "en",
                "target": "ja",
                "beam_size": rng.choice([1, 1, 2, 4]),
                "max_length": 16,
            }
        )
    return out


async def concurrently(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        return list(await asyncio.gather(*(c.post("/translate", json=b) for b in bodies)))


def batch_size_sum_and_count(server: Server) -> tuple[float, float]:
    with server.client() as c:
        text = c.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith(('attnserve_batch_size_sum{pair="en-ja"}', 'attnserve_batch_size_count{pair="en-ja"}')):
            name, value = line.split()
            values[name.split("{")[0]] = float(value)
    return values["attnserve_batch_size_sum"], values["attnserve_batch_size_count"]


def test_64_concurrent_requests_equal_one_at_a_time(make_server: ServerFactory) -> None:
    bodies = mixed_requests()
    server = make_server(max_batch_size=32, max_wait_ms=20)
    with server.client() as c:
        alone = [c.post("/translate", json=b).json()["translatedText"] for b in bodies]
    sum_before, count_before = batch_size_sum_and_count(server)
    together = asyncio.run(concurrently(server.url, bodies))
    assert [r.status_code for r in together] == [200] * len(bodies)
    assert [r.json()["translatedText"] for r in together] == alone
    total, count = batch_size_sum_and_count(server)
    assert (total - sum_before) / (count - count_before) > 1.5, "requests should have shared decoding steps"


def test_unbatched_server_gives_the_same_answers(make_server: ServerFactory) -> None:
    bodies = mixed_requests(16)
    batched = make_server(max_batch_size=32)
    single = make_server(max_batch_size=1)
    a = asyncio.run(concurrently(batched.url, bodies))
    b = asyncio.run(concurrently(single.url, bodies))
    assert [r.json() for r in a] == [r.json() for r in b]


def test_two_decoding_threads_give_the_same_answers_and_share_the_work(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = mixed_requests(32)
    one = make_server(max_batch_size=4)
    two = make_server(max_batch_size=4, decode_threads=2)
    a = asyncio.run(concurrently(one.url, bodies))
    stepped: set[int] = set()
    step = BatchDecoder.step

    def recorded(self: BatchDecoder) -> Any:
        stepped.add(id(self))
        return step(self)

    monkeypatch.setattr(BatchDecoder, "step", recorded)
    b = asyncio.run(concurrently(two.url, bodies))
    assert [r.json() for r in a] == [r.json() for r in b]
    (engine,) = two.app.state.attnserve.models.registry.engines()
    schedulers = engine.schedulers["fast"]
    assert len(schedulers) == 2 and all(s.decoder.runner is engine.runners.fast for s in schedulers)
    assert stepped == {id(s.decoder) for s in schedulers}, "both decoding threads should have decoded"
