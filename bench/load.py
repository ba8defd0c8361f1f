"""Open-loop Poisson load over HTTP: arrival plans, their runs, latency percentiles, rate sweeps, the mixed load."""

from __future__ import annotations

import asyncio
import gc
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx
from common import (
    Server,
    attnserve_server,
)

if TYPE_CHECKING:
    from service.runtime.bundle import Bundle

SLO_S = 1.0  # the latency objective: p99 at most this


class Arrival(NamedTuple):
    at: float  # seconds after the start
    label: str  # request class ("all", "short", "long")
    body: dict[str, Any]


class Outcome(NamedTuple):
    label: str
    latency: float  # seconds from the scheduled send time
    ok: bool


@dataclass(frozen=True)
class LoadPoint:
    offered: float  # requests/s
    achieved: float  # successful requests/s
    p50: float  # seconds; inf when errors reach the percentile
    p95: float
    p99: float
    errors: int
    n: int

    @property
    def sustained(self) -> bool:
        return self.errors == 0 and self.p99 <= SLO_S


Curves = dict[tuple[str, int], tuple[list[LoadPoint], float | None]]  # (server, threads) -> points, peak RSS MB


def poisson_plan(
    rate: float, seconds: float, choose: Callable[[random.Random], tuple[str, dict[str, Any]]], seed: int
) -> list[Arrival]:
    """Arrivals at ``rate`` per second for ``seconds``; ``choose(rng)`` returns (label, body) for each."""
    rng = random.Random(seed)
    plan, t = [], rng.expovariate(rate)
    while t < seconds:
        label, body = choose(rng)
        plan.append(Arrival(t, label, body))
        t += rng.expovariate(rate)
    return plan


async def run_plan(url: str, plan: list[Arrival], timeout: float) -> tuple[list[Outcome], float]:
    """Send every arrival at its time, whatever the answers before it (open loop); returns outcomes and the
    seconds from the start to the last answer. aiohttp, not httpx: it spends far less CPU a request on loopback,
    CPU the server on the same machine would lose.

    The objects this process already holds (torch, transformers, the bundle) are frozen out of the garbage
    collector's way for the run: its full collections would pause the load generator, and the latencies would count
    the pauses."""
    import aiohttp

    outcomes: list[Outcome] = []
    gc.collect()
    gc.freeze()
    try:
        connector = aiohttp.TCPConnector(limit=1024)
        timeouts = aiohttp.ClientTimeout(total=timeout)
        async with aiohttp.ClientSession(url, connector=connector, timeout=timeouts) as client:
            start = time.perf_counter()

            async def send(a: Arrival) -> None:
                await asyncio.sleep(max(0.0, start + a.at - time.perf_counter()))
                try:
                    async with client.post("/translate", json=a.body) as response:
                        await response.read()
                        ok = response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                outcomes.append(Outcome(a.label, time.perf_counter() - (start + a.at), ok))

            await asyncio.gather(*(send(a) for a in plan))
            return outcomes, time.perf_counter() - start
    finally:
        gc.unfreeze()


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation, so an infinite value stays one)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summarize(outcomes: Sequence[Outcome], offered: float, elapsed: float) -> LoadPoint:
    """Latency percentiles (a failed request counts as infinitely slow) and achieved throughput: successes over
    ``elapsed`` (the arrival window, or longer when the last answers came after it)."""
    latencies = [o.latency if o.ok else math.inf for o in outcomes]
    ok = sum(o.ok for o in outcomes)
    return LoadPoint(
        offered=offered,
        achieved=ok / elapsed if elapsed > 0 else 0.0,
        p50=percentile(latencies, 50),
        p95=percentile(latencies, 95),
        p99=percentile(latencies, 99),
        errors=len(outcomes) - ok,
        n=len(outcomes),
    )


def best_sustained(points: Sequence[LoadPoint]) -> LoadPoint | None:
    """The point with the highest achieved throughput among those with p99 ≤ 1 s and no error."""
    ok = [p for p in points if p.sustained]
    return max(ok, key=lambda p: p.achieved) if ok else None


def warm_up(url: str, body: dict[str, Any], n: int = 3) -> None:
    for _ in range(n):
        httpx.post(url + "/translate", json=body, timeout=120).raise_for_status()


def refine_rate(points: Sequence[LoadPoint]) -> float | None:
    """The offered rate halfway between the best sustained point's and the lowest one above it (which did not hold);
    None when nothing holds or nothing above was tried. Bisecting there narrows the best sustained rate that a
    coarse list of rates would miss by up to a step."""
    best = best_sustained(points)
    above = [p.offered for p in points if best is not None and p.offered > best.offered]
    return (best.offered + min(above)) / 2 if best is not None and above else None


def sweep(
    server: Server,
    bodies: list[dict[str, Any]],
    rates: Sequence[float],
    seconds: float,
    stop_p99: float,
    timeout: float,
    refine: int = 0,
) -> list[LoadPoint]:
    """Rising offered loads until one has errors or a p99 over ``stop_p99`` (its point is kept: the curve's knee),
    then ``refine`` more rates bisecting towards the best sustained one (:func:`refine_rate`); sorted by rate."""
    from tqdm import tqdm

    def measure(rate: float) -> LoadPoint | None:
        plan = poisson_plan(rate, seconds, lambda rng: ("all", rng.choice(bodies)), seed=int(rate * 1000))
        if not plan:
            return None
        outcomes, elapsed = asyncio.run(run_plan(server.url, plan, timeout))
        time.sleep(1.0)  # let stragglers finish before the next rate
        return summarize(outcomes, rate, max(elapsed, seconds))

    warm_up(server.url, bodies[0])
    points: list[LoadPoint] = []
    for rate in tqdm(rates, desc="load", unit="rate", leave=False):
        if (point := measure(rate)) is None:
            continue
        points.append(point)
        if point.errors or point.p99 > stop_p99:
            break
    for _ in range(refine):
        if (rate := refine_rate(points)) is None or (point := measure(rate)) is None:
            break
        points.append(point)
    return sorted(points, key=lambda p: p.offered)


def continuous_batching_switch() -> bool:
    """Whether the service reads ``ATTNSERVE_CONTINUOUS_BATCHING`` (without it, both mixed runs are the same)."""
    from service.settings import Settings

    return "continuous_batching" in Settings.model_fields


def mixed_load(
    bundle: Bundle,
    sentences: list[str],
    lengths: list[int],
    rate: float,
    seconds: float,
    threads: int,
    long_max_length: int,
    timeout: float,
    settings: Sequence[str] = ("true", "false"),
) -> dict[str, dict[str, LoadPoint]]:
    """10 % long requests (the longest tenth of the sentences, ``max_length=long_max_length``) and 90 % short ones
    (the shorter half), one plan, sent to attnserve with each of ``settings`` of continuous batching in turn (on,
    then off)."""
    order = sorted(range(len(sentences)), key=lambda i: lengths[i])
    short = [sentences[i] for i in order[: max(1, len(order) // 2)]]
    long = [sentences[i] for i in order[-max(1, len(order) // 10) :]]
    pair = {"source": bundle.source_lang, "target": bundle.target_lang}

    def choose(rng: random.Random) -> tuple[str, dict[str, Any]]:
        if rng.random() < 0.1:
            return "long", {"q": rng.choice(long), **pair, "max_length": long_max_length}
        return "short", {"q": rng.choice(short), **pair}

    plan = poisson_plan(rate, seconds, choose, seed=7)
    results: dict[str, dict[str, LoadPoint]] = {}
    for setting in settings:
        env = {"ATTNSERVE_DECODE_THREADS": str(threads), "ATTNSERVE_THREADS": "1", "OMP_NUM_THREADS": "1"}
        env["ATTNSERVE_CONTINUOUS_BATCHING"] = setting
        with attnserve_server(bundle.path, env) as server:
            warm_up(server.url, {"q": short[0], **pair})
            outcomes, elapsed = asyncio.run(run_plan(server.url, plan, timeout))
        results[setting] = {
            label: summarize([o for o in outcomes if label in ("all", o.label)], rate, max(elapsed, seconds))
            for label in ("short", "long", "all")
        }
    return results


# ---------------------------------------------------------------------------------------------------------------
# Report.
