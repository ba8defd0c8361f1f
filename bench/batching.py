"""Dynamic batching on versus off, in one run: 32 closed-loop clients against `attnserve serve` on loopback.

Starts the server twice (ATTNSERVE_MAX_BATCH_SIZE=32, then =1), each time sends texts from the test split for a
fixed time with every client waiting for its answer before sending the next, and reports sentences/s and
p50/p95/p99 latency. Writes its section of docs/BENCHMARKS.md.

    python bench/batching.py --bundle model/bundles/en-ja --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import time
from pathlib import Path

import numpy as np
from common import CORPUS, ROOT, attnserve_server, texts, write_section


async def closed_loop(url: str, sentences: list[str], clients: int, seconds: float) -> dict[str, float]:
    """``clients`` loops that each send a text and wait for its answer; aiohttp, the lighter client on the same
    cores (bench/peers.py's run_plan says why)."""
    import aiohttp

    latencies: list[float] = []
    stop = time.monotonic() + seconds
    rng = random.Random(1)

    async def client(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            body = {"q": rng.choice(sentences), "source": "en", "target": "ja"}
            t0 = time.perf_counter()
            async with http.post("/translate", json=body) as r:
                await r.read()
                r.raise_for_status()
            latencies.append(time.perf_counter() - t0)

    t0 = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    elapsed = time.monotonic() - t0
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    return {
        "sentences/s": len(latencies) / elapsed,
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "n": len(latencies),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV whose first column is the source text")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    args = ap.parse_args()
    sentences = texts(args.texts)
    rows = {}
    for label, env in (("batching on (max_batch_size 32)", "32"), ("batching off (max_batch_size 1)", "1")):
        with attnserve_server(args.bundle, {"ATTNSERVE_MAX_BATCH_SIZE": env, "ATTNSERVE_THREADS": "1"}) as server:
            asyncio.run(closed_loop(server.url, sentences, args.clients, 5))  # warm-up
            rows[label] = asyncio.run(closed_loop(server.url, sentences, args.clients, args.seconds))
        print(label, {k: round(v, 3) for k, v in rows[label].items()}, flush=True)
    on, off = rows.values()
    ratio = on["sentences/s"] / off["sentences/s"]
    table = "\n".join(
        f"| {label} | {r['sentences/s']:.1f} | {r['p50'] * 1000:.0f} | "
        f"{r['p95'] * 1000:.0f} | {r['p99'] * 1000:.0f} | {r['n']:.0f} |"
        for label, r in rows.items()
    )
    source = args.texts if args.texts.exists() else "built-in list"
    body = f"""## Dynamic batching (bench/batching.py)

`python bench/batching.py --bundle {os.path.relpath(args.bundle, ROOT)} --seconds {args.seconds:g}` —
{args.clients} closed-loop clients (aiohttp) on loopback, {len(sentences)} source texts ({source}),
greedy, one ONNX Runtime thread, on {platform.machine()} with {os.cpu_count()} cores ({platform.processor() or "cpu"}).

| server | sentences/s | p50 ms | p95 ms | p99 ms | requests |
|---|---|---|---|---|---|
{table}

Batching on / off throughput: **{ratio:.1f}×**.
"""
    write_section("batching", body)
    print(f"throughput ratio {ratio:.2f}x; wrote docs/BENCHMARKS.md")


if __name__ == "__main__":
    main()
