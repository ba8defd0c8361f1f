"""The response cache: bounded, least recently used dropped first, and the engine answering repeated texts from it
with the answers decoding gives (service/serving/cache.py)."""

from __future__ import annotations

import asyncio
import sys

import httpx

from service.serving.cache import ENTRY_BYTES, LruCache, through_cache
from service.serving.translation import Options, Translation
from tests.service.conftest import ServerFactory
from tests.service.serving.test_engine import fake_engine
from tests.service.test_metrics import samples


def size(*strings: str) -> int:
    return ENTRY_BYTES + sum(sys.getsizeof(s) for s in strings)


def test_the_least_recently_used_entry_goes_first_once_full() -> None:
    cache = LruCache[str](3 * size("k", "v"))
    for k in "abc":
        cache.put(k, k.upper(), "k", "v")
    assert cache.get("a") == "A"  # a is now the most recently used: b goes first
    cache.put("d", "D", "k", "v")
    assert [cache.get(k) for k in "abcd"] == ["A", None, "C", "D"]
    assert (cache.hits, cache.misses, len(cache)) == (4, 1, 3)
    assert cache.used <= cache.capacity


def test_an_entry_over_the_whole_bound_is_not_kept() -> None:
    cache = LruCache[str](size("x" * 10))
    cache.put("big", "value", "x" * 100)
    assert cache.get("big") is None and cache.used == 0


def test_through_cache_translates_only_the_missing_texts() -> None:
    cache = LruCache[str](1 << 20)
    asked: list[list[str]] = []

    async def translate(texts: list[str]) -> list[str]:
        asked.append(texts)
        return [t.upper() for t in texts]

    def run(texts: list[str]) -> tuple[list[str], int]:
        return asyncio.run(through_cache(cache, texts, "opts", translate, lambda v: [v]))

    assert run(["a", "b"]) == (["A", "B"], 2)
    assert run(["b", "c", "a"]) == (["B", "C", "A"], 1)
    assert run(["c", "a"]) == (["C", "A"], 0)
    assert asked == [["a", "b"], ["c"]]
    assert asyncio.run(through_cache(cache, ["a"], "other options", translate, lambda v: [v])) == (["A"], 1)


def test_the_engine_answers_repeated_texts_from_the_cache_as_decoding_does() -> None:
    engine, plain = fake_engine(cache_mb=1), fake_engine()
    counted: list[tuple[int, int]] = []
    first, second = ["Open the file", "Settings"], ["Settings", "Delete the selected files", "Open the file"]

    async def served() -> tuple[list[Translation], list[Translation], int, list[Translation]]:
        await engine.start(on_cache=lambda hits, misses: counted.append((hits, misses)))
        try:
            a = await engine.translate(first, Options())
            rows = len(engine.runners.fast.step_rows)  # type: ignore[attr-defined]
            b = await engine.translate(second, Options())
            steps = len(engine.runners.fast.step_rows) - rows  # type: ignore[attr-defined]
            await engine.translate(second, Options(details=True))  # details answers: never from the cache
            return a, b, steps, await engine.translate(["Settings"], Options(beam_size=2))
        finally:
            await engine.stop()

    a, b, steps, beam2 = asyncio.run(served())
    assert [t.text for t in b] == [t.text for t in plain.translate_now(second, Options())]
    assert b[0] is a[1] and b[2] is a[0]  # the very answers decoding gave
    assert steps == len(engine.tokenizer.encode_source("Delete the selected files"))  # one text decoded alone
    assert counted == [(0, 2), (2, 1), (0, 1)]  # the details request is not counted: it skips the cache
    assert beam2[0].text == plain.translate_now(["Settings"], Options(beam_size=2))[0].text


def test_cache_metrics_count_hits_and_misses(make_server: ServerFactory) -> None:
    server = make_server(cache_mb=1)
    body = {"q": ["Open file", "Settings"], "source": "en", "target": "ja"}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        first = c.post("/translate", json=body)
        again = c.post("/translate", json={**body, "q": ["Settings", "Open file"]})
        counts = samples(c.get("/metrics").text)
    assert first.status_code == again.status_code == 200
    assert again.json()["translatedText"] == first.json()["translatedText"][::-1]
    assert counts["attnserve_cache_hits_total"] == 2 and counts["attnserve_cache_misses_total"] == 2
