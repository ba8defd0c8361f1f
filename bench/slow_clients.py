"""Slow and idle clients against normal ones: the p50/p99 of normal /translate requests alone, then beside idle
keep-alive connections and clients trickling a body byte by byte (each reconnects when the server closes it), and
how the server's deadlines closed them. Writes the ``slow-clients`` section of docs/BENCHMARKS.md.

    python bench/slow_clients.py [--bundle DIR] [--seconds 15] [--rounds 3] [--idle 200] [--trickle 20]

tests/service/http/test_slow_clients.py drives the same clients against an in-process server.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REQUEST = {"q": "Open file", "source": "en", "target": "ja"}


@dataclass
class Closures:
    """What the server did to the attacking connections: how long each lived, and the status lines it sent."""

    lifetimes: list[float] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := await reader.read(65536):
        data += chunk
    return data


async def idle(host: str, port: int, closures: Closures, request_first: bool, stop: asyncio.Event) -> None:
    """One idle connection, opened again whenever the server closes it; with ``request_first`` it sends one
    keep-alive request and reads its answer first (a keep-alive connection), else nothing at all."""
    while not stop.is_set():
        reader, writer = await asyncio.open_connection(host, port)
        start = time.perf_counter()
        if request_first:
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            await reader.readuntil(b"}")  # {"status":"ok"}
            start = time.perf_counter()
        await _wait_or_stop(_until_closed(reader), stop)
        if not stop.is_set():
            closures.lifetimes.append(time.perf_counter() - start)
        writer.close()


async def trickle(host: str, port: int, closures: Closures, interval: float, stop: asyncio.Event) -> None:
    """A client that sends a /translate body one byte every ``interval`` seconds, again whenever it is closed."""
    body = b'{"q": "' + b"x" * 4000 + b'", "source": "en", "target": "ja"}'
    while not stop.is_set():
        reader, writer = await asyncio.open_connection(host, port)
        start = time.perf_counter()
        head = f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode())
        answer = asyncio.ensure_future(_until_closed(reader))
        for byte in body:
            if answer.done() or stop.is_set():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(interval)
        data = await _wait_or_stop(answer, stop)
        if data is not None:
            closures.lifetimes.append(time.perf_counter() - start)
            closures.statuses.append(data.split(b"\r\n", 1)[0].decode())
        writer.close()


async def _wait_or_stop(work: Awaitable[bytes], stop: asyncio.Event) -> bytes | None:
    """What ``work`` returns (b"" for a reset connection), or None when ``stop`` came first."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        return None
    try:
        return task.result()
    except (ConnectionError, asyncio.IncompleteReadError):
        return b""


async def normal(url: str, seconds: float, workers: int) -> list[float]:
    """Latencies of /translate requests from ``workers`` closed-loop clients for ``seconds``; all must answer 200."""
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < end:
            start = time.perf_counter()
            r = await client.post("/translate", json=REQUEST)
            latencies.append(time.perf_counter() - start)
            assert r.status_code == 200, r.text

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(workers)))
    return latencies


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


@dataclass
class Result:
    alone: list[float] = field(default_factory=list)
    beside: list[float] = field(default_factory=list)
    kept_alive: Closures = field(default_factory=Closures)
    silent: Closures = field(default_factory=Closures)
    trickling: Closures = field(default_factory=Closures)


async def run(
    url: str, seconds: float, idle_n: int, trickle_n: int, workers: int, interval: float, rounds: int = 1
) -> Result:
    """``rounds`` times: normal clients alone for ``seconds``, then beside ``idle_n`` idle connections (half of
    them keep-alive after one request, half silent) and ``trickle_n`` byte-by-byte bodies for ``seconds``
    (alternating, so that a neighbour's load on the machine falls on both)."""
    host, port = url.removeprefix("http://").split(":")
    result = Result()
    await normal(url, 1.0, workers)  # warm-up
    for _ in range(rounds):
        result.alone += await normal(url, seconds, workers)
        stop = asyncio.Event()
        attackers = [idle(host, int(port), result.kept_alive, True, stop) for _ in range(idle_n // 2)]
        attackers += [idle(host, int(port), result.silent, False, stop) for _ in range(idle_n - idle_n // 2)]
        attackers += [trickle(host, int(port), result.trickling, interval, stop) for _ in range(trickle_n)]
        tasks = [asyncio.ensure_future(a) for a in attackers]
        await asyncio.sleep(1.0)  # every attacker connected
        result.beside += await normal(url, seconds, workers)
        stop.set()
        await asyncio.gather(*tasks)
    return result


def report(r: Result, args: argparse.Namespace, command: str, machine: str) -> str:
    ms = 1000
    rows = [
        ("alone", r.alone),
        (f"beside {args.idle} idle + {args.trickle} trickling", r.beside),
    ]
    lines = [
        f"`{command}` ({args.workers} closed-loop clients, /translate of one short text, {args.rounds} rounds of "
        f"{args.seconds:g} s alone then {args.seconds:g} s beside the slow clients; the bundle `{args.bundle}`; "
        f"default deadlines: keep-alive 5 s, request head 10 s, body 10 s; {machine}, shared with other work).",
        "",
        "| normal clients | requests | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {len(v)} | {statistics.median(v) * ms:.1f} | {p99(v) * ms:.1f} |" for name, v in rows]
    ratio = p99(r.beside) / p99(r.alone)
    statuses = Counter(s or "a reset (written to after the close)" for s in r.trickling.statuses)

    def closed(c: Closures) -> str:
        return f"{len(c.lifetimes)}, after {min(c.lifetimes, default=0):.1f}–{max(c.lifetimes, default=0):.1f} s"

    lines += [
        "",
        f"p99 beside the slow clients / alone: **{ratio:.2f}×** (the goal: at most 1.2×). The phases alternate, so "
        "that other work on the machine falls on both; where the machine is shared, compare several runs.",
        "",
        "Connections the server closed: idle keep-alive ones " + closed(r.kept_alive) + "; silent ones (no "
        "request) "
        + closed(r.silent)
        + "; trickling bodies "
        + closed(r.trickling)
        + ", answered "
        + (", ".join(f"{s} ({n})" for s, n in sorted(statuses.items())) or "nothing")
        + ".",
    ]
    return "\n".join(lines)


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import attnserve_server, machine, write_section

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=Path("model/bundles/en-ja"))
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of each phase")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--trickle", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between a trickler's bytes")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with attnserve_server(args.bundle, {}) as server:
        result = asyncio.run(
            run(server.url, args.seconds, args.idle, args.trickle, args.workers, args.interval, args.rounds)
        )
    shown = "python bench/slow_clients.py " + " ".join(sys.argv[1:])
    text = report(result, args, shown.strip(), machine())
    print(text)
    if not args.no_write:
        write_section("slow-clients", "## Slow and idle clients\n\n" + text)


if __name__ == "__main__":
    main()
