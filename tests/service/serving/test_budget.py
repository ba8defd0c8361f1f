"""The in-flight memory budget (service/serving/budget.py): waits oldest first, refuses at the deadline or when a
request
could never fit, hands memory back once idle and now and then under load; and its estimates against the model's
sizes."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.decoding import DecodeRequest
from service.errors import TooLarge
from service.serving import budget as budget_module
from service.serving.budget import Budget, BudgetFull, answer_bytes, request_bytes
from service.serving.scheduler import QueueFull
from service.serving.translation import Filters
from service.settings import Settings
from tests.service.fake_runner import SPEC


def test_holds_wait_oldest_first_and_are_handed_on() -> None:
    budget = Budget(100)
    order: list[str] = []

    async def hold(name: str, size: int, seconds: float) -> None:
        async with budget.hold(size, time.monotonic() + 5):
            order.append(f"+{name}")
            await asyncio.sleep(seconds)
        order.append(f"-{name}")

    async def go() -> None:
        a = asyncio.create_task(hold("a", 60, 0.05))
        await asyncio.sleep(0.01)
        b = asyncio.create_task(hold("b", 60, 0.01))
        await asyncio.sleep(0.01)
        c = asyncio.create_task(hold("c", 10, 0.01))  # fits beside a, but b came first
        await asyncio.gather(a, b, c)

    asyncio.run(go())
    assert order.index("+b") > order.index("-a") and order.index("+c") > order.index("+b")
    assert budget.used == 0


def test_a_hold_past_its_deadline_is_refused_with_retry_after() -> None:
    budget = Budget(100)

    async def go() -> None:
        async with budget.hold(80, time.monotonic() + 5):
            with pytest.raises(BudgetFull) as full:
                async with budget.hold(40, time.monotonic() + 0.05):
                    pass
            assert isinstance(full.value, QueueFull) and full.value.retry_after >= 1  # 503 + Retry-After
            assert "memory" in str(full.value)
            async with budget.hold(20, time.monotonic() + 0.05):  # the one that gave up left no trace
                assert budget.used == 100

    asyncio.run(go())
    assert budget.used == 0


def test_a_request_over_the_whole_budget_is_refused_at_once() -> None:
    budget = Budget(100 << 20)

    async def go() -> None:
        with pytest.raises(TooLarge, match="memory_budget_mb=100") as e:
            async with budget.hold(101 << 20, time.monotonic() + 5):
                pass
        assert (e.value.field, e.value.limit) == ("memory_budget_mb", 100)

    asyncio.run(go())


def test_a_cancelled_waiter_gives_its_place_back() -> None:
    budget = Budget(100)

    async def go() -> None:
        async with budget.hold(100, time.monotonic() + 5):
            waiter = asyncio.create_task(budget.hold(50, time.monotonic() + 5).__aenter__())
            await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        async with budget.hold(100, time.monotonic() + 0.05):
            pass

    asyncio.run(go())
    assert budget.used == 0


def test_trim_is_called_once_nothing_was_held_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget_module, "IDLE_S", 0.05)
    calls: list[float] = []
    budget = Budget(100, trim=lambda: calls.append(time.monotonic()))

    async def go() -> None:
        for _ in range(3):  # busy again within IDLE_S: no call yet
            async with budget.hold(10, time.monotonic() + 5):
                await asyncio.sleep(0.03)
        assert calls == []
        await asyncio.sleep(0.2)

    asyncio.run(go())
    assert len(calls) == 1


def test_trim_is_called_under_steady_load_at_most_every_trim_every_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budget_module, "IDLE_S", 10.0)  # never idle here
    calls: list[float] = []
    budget = Budget(100, trim=lambda: calls.append(time.monotonic()), trim_every_s=0.1)

    async def client() -> None:
        end = time.monotonic() + 0.55
        while time.monotonic() < end:
            async with budget.hold(10, time.monotonic() + 5):
                await asyncio.sleep(0.01)

    async def go() -> None:
        await asyncio.gather(client(), client())  # overlapping holds: the budget never empties
        await asyncio.sleep(0.05)  # let the executor run the last call

    start = time.monotonic()
    asyncio.run(go())
    elapsed = time.monotonic() - start
    assert 3 <= len(calls) <= elapsed / 0.1 + 1  # again and again under load, never more often than trim_every_s


def test_attention_costs_grow_with_source_and_target_and_the_default_budget_serves_the_largest() -> None:
    plain = DecodeRequest(src=[2] * 50, beam_size=4, max_length=60)
    attention = DecodeRequest(src=[2] * 50, beam_size=4, max_length=60, attention=True)
    assert request_bytes(attention, SPEC) > 10 * request_bytes(plain, SPEC)
    longer = DecodeRequest(src=[2] * 60, beam_size=4, max_length=60, attention=True)
    assert request_bytes(longer, SPEC) > request_bytes(attention, SPEC)
    forced = DecodeRequest(src=[2] * 50, max_length=64, forced=[3] * 60, attention=True)
    assert request_bytes(forced, SPEC) < request_bytes(attention, SPEC)  # one row instead of four
    assert answer_bytes(SPEC, forced, Filters(kinds=["cross"])) < answer_bytes(SPEC, forced, Filters())

    # The shipped model's sizes (3 + 3 layers, 8 heads) at the default limits: 256 source tokens, beam 8, 256 steps.
    from service.runtime.bundle import ModelSpec

    model = ModelSpec(
        vocab_size=8000, d_model=256, h=8, n_encoder_layers=3, n_decoder_layers=3, max_positions=256,
        pad_id=7999, eos_id=0, unk_id=1, decoder_start_id=7999,
    )  # fmt: skip
    largest = DecodeRequest(src=[2] * 256, beam_size=8, max_length=256, attention=True)
    size = request_bytes(largest, model) + answer_bytes(model, largest, Filters())
    redecode = request_bytes(largest, model)  # /attention holds a constrained re-decode of a text with spans too
    assert size + redecode < Settings().memory_budget_mb << 20
