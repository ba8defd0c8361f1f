"""Fair admission: single-text requests sent into a flood of the largest requests the default limits allow.

``--large`` closed-loop clients each send the largest /translate request that the defaults accept (``--texts``
texts of 256 tokens, beam 8: texts × beam × max_length just within request_timeout_s × decode_rate), while one
open-loop client sends a one-text greedy request every ``1 / --rate`` seconds. Reports the small requests' p50 and
p99 and the large ones' latencies and statuses, with the small-request share kept (the default) and without it
(``ATTNSERVE_SMALL_REQUEST_SHARE=0``). Then one largest request alone on an idle server: the defaults must let it
finish within the deadline.

    python bench/flood.py --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import numpy as np
from common import ROOT, attnserve_server, machine, write_section
from memory import WORDS, TokenCounter, longest_text

SMALL = "Open the file."


def large_texts(bundle: Path, n: int) -> list[str]:
    """``n`` different texts of 256 source tokens."""
    count = TokenCounter(bundle)
    return [longest_text(256, (173 * i) % (len(WORDS) - 600), count) for i in range(n)]


async def flood(url: str, large: list[str], clients: int, rate: float, seconds: float) -> dict[str, list]:
    import aiohttp

    out: dict[str, list] = {"small": [], "small_status": [], "large": [], "large_status": []}
    stop = time.monotonic() + seconds
    pair = {"source": "en", "target": "ja"}

    async def send(http: aiohttp.ClientSession, body: dict[str, object], kind: str) -> None:
        t0 = time.perf_counter()
        async with http.post("/translate", json=body) as r:
            await r.read()
            out[kind].append(time.perf_counter() - t0)
            out[f"{kind}_status"].append(r.status)

    async def large_client(http: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            await send(http, {"q": large, "beam_size": 8, **pair}, "large")

    async def small_client(http: aiohttp.ClientSession) -> None:
        await asyncio.sleep(2)  # the large requests fill the batch first
        tasks = []
        while time.monotonic() < stop:
            tasks.append(asyncio.create_task(send(http, {"q": SMALL, **pair}, "small")))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(small_client(http), *(large_client(http) for _ in range(clients)))
    return out


async def alone(url: str, large: list[str]) -> tuple[float, int]:
    import aiohttp

    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=120)) as http:
        t0 = time.perf_counter()
        async with http.post("/translate", json={"q": large, "beam_size": 8, "source": "en", "target": "ja"}) as r:
            await r.read()
            return time.perf_counter() - t0, r.status


# long: parse, run, summarize, plot and write, in order
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--large", type=int, default=2, help="closed-loop clients sending the largest requests")
    ap.add_argument("--texts", type=int, default=29, help="texts in a large request (29 × 8 × 256 ≤ 30 × 2000)")
    ap.add_argument("--rate", type=float, default=4, help="small requests a second")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    large = large_texts(args.bundle, args.texts)
    rows, lone = [], None
    for label, share in (("small-request share 0.125 (default)", None), ("no share (0)", "0")):
        env = {"ATTNSERVE_THREADS": "1"} | ({"ATTNSERVE_SMALL_REQUEST_SHARE": share} if share else {})
        with attnserve_server(args.bundle, env) as server:
            if lone is None:
                lone = asyncio.run(alone(server.url, large))
                print(f"the largest request alone: {lone[0]:.1f} s, status {lone[1]}", flush=True)
            r = asyncio.run(flood(server.url, large, args.large, args.rate, args.seconds))
        small = np.asarray(r["small"])
        statuses = {s: r["large_status"].count(s) for s in sorted(set(r["large_status"]))}
        small_statuses = {s: r["small_status"].count(s) for s in sorted(set(r["small_status"]))}
        row = (
            f"| {label} | {len(small)} {small_statuses} | {np.percentile(small, 50) * 1000:.0f} | "
            f"{np.percentile(small, 99) * 1000:.0f} | {small.max() * 1000:.0f} | {statuses} | "
            f"{np.median(r['large']):.1f} |"
        )
        print(row, flush=True)
        rows.append(row)
    if args.no_write:
        return
    assert lone is not None
    body = f"""## Fair admission under a flood of large requests (bench/flood.py)

`python bench/flood.py --seconds {args.seconds:g}` on {machine()}, load average {os.getloadavg()[0]:.1f} at the end
(other work shares the machine). {args.large} closed-loop clients send the largest /translate request the defaults
accept ({args.texts} texts of 256 tokens, beam 8: {args.texts * 8 * 256} generated tokens at most, within
request_timeout_s × decode_rate = 60,000), while one client sends "{SMALL}" {args.rate:g} times a second.

| server | small answers (statuses) | small p50 ms | small p99 ms | small max ms | large statuses | large median s |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

The largest request alone on an idle server: {lone[0]:.1f} s (status {lone[1]}), within the 30 s deadline.
"""
    write_section("flood", body)


if __name__ == "__main__":
    main()
