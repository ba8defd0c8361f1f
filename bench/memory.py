"""Memory under a burst of maximal /attention requests: the server's resident memory sampled through the burst and
the idle time after it, plotted, with the burst's latencies and status codes.

Each request is as large as the default limits allow: a source text of ``max_tokens`` tokens force-decoding a
target text of ``max_length`` tokens, so every answer holds all three kinds of weights at their largest.

    python bench/memory.py --requests 48 --idle 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
from common import DOCS, ROOT, attnserve_server, machine, write_section

WORDS = re.sub(r"[`|#*\[\]()_<>]", " ", " ".join(p.read_text() for p in sorted(DOCS.glob("*.md")))).split()


def longest_text(tokens: int, offset: int, count: TokenCounter) -> str:
    """The longest run of :data:`WORDS` from ``offset`` whose encoding has at most ``tokens`` tokens."""
    lo, hi = 1, 600
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(WORDS[offset : offset + mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(WORDS[offset : offset + lo])


class TokenCounter:
    """Source and target token counts from the bundle's own tokenizer (service.runtime.bundle, no model)."""

    def __init__(self, bundle: Path, target: bool = False) -> None:
        from service.runtime.bundle import load_bundle

        self.tokenizer = load_bundle(bundle).tokenizer
        self.target = target

    def __call__(self, text: str) -> int:
        encode = self.tokenizer.encode_target if self.target else self.tokenizer.encode_source
        return len(encode(text))


def maximal_body(bundle: Path, max_tokens: int = 256, max_length: int = 256) -> dict[str, object]:
    """An /attention body at the default limits: ``max_tokens`` source tokens, ``max_length`` forced target
    tokens (beam_size is sent, but a forced target decodes one row)."""
    source = longest_text(max_tokens, 0, TokenCounter(bundle))
    target = longest_text(max_length, 2000, TokenCounter(bundle, target=True))
    return {"q": source, "target_text": target, "source": "en", "target": "ja", "beam_size": 8}


class RssSampler(threading.Thread):
    """Samples a process's resident memory (VmRSS, MiB) every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MiB)
        self._done = threading.Event()
        self.t0 = time.monotonic()

    def rss(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def run(self) -> None:
        while not self._done.is_set():
            self.samples.append((time.monotonic() - self.t0, self.rss()))
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()

    def mark(self) -> float:
        return time.monotonic() - self.t0


async def burst(url: str, body: dict[str, object], n: int) -> tuple[list[float], list[int]]:
    """``n`` concurrent requests; their latencies (s) and statuses."""
    import aiohttp

    async def one(http: aiohttp.ClientSession) -> tuple[float, int]:
        t0 = time.perf_counter()
        async with http.post("/attention", json=body) as r:
            await r.read()
            return time.perf_counter() - t0, r.status

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=aiohttp.TCPConnector(limit=n)) as http:
        results = await asyncio.gather(*(one(http) for _ in range(n)))
    return [t for t, _ in results], [s for _, s in results]


def plot(samples: list[tuple[float, float]], marks: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([t for t, _ in samples], [m for _, m in samples], lw=1.2)
    for label, t in marks.items():
        ax.axvline(t, color="grey", ls="--", lw=0.8)
        ax.text(t, ax.get_ylim()[1] * 0.97, f" {label}", va="top", fontsize=8)
    ax.set_xlabel("seconds")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title("Resident memory through a burst of maximal /attention requests")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def measure(bundle: Path, n: int, idle: float, env: dict[str, str]) -> dict[str, object]:
    """One server, one burst of ``n`` requests, ``idle`` seconds after it; the figures and the RSS samples."""
    body = maximal_body(bundle)
    with attnserve_server(bundle, env) as server:
        sampler = RssSampler(server.process.pid)
        sampler.start()
        time.sleep(1)
        idle_before = sampler.rss()
        start = sampler.mark()
        latencies, statuses = asyncio.run(burst(server.url, body, n))
        end = sampler.mark()
        time.sleep(idle)
        after = sampler.rss()
        sampler.stop()
    peak = max(m for _, m in sampler.samples)
    return {
        "idle": idle_before,
        "peak": peak,
        "after": after,
        "seconds": end - start,
        "latencies": latencies,
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
        "samples": sampler.samples,
        "marks": {"burst": start, "burst answered": end},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--idle", type=float, default=20, help="seconds sampled after the burst")
    ap.add_argument("--env", nargs="*", default=[], help="extra ATTNSERVE_NAME=value settings")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = ap.parse_args()
    # Lines up to max_chars stay whole: the maximal text is one segment of max_tokens, as /attention decodes it.
    env = {
        "ATTNSERVE_THREADS": "1",
        "ATTNSERVE_SENTENCE_SPLIT_CHARS": "5000",
        **dict(e.split("=", 1) for e in args.env),
    }
    r = measure(args.bundle, args.requests, args.idle, env)
    lat = np.asarray(r["latencies"])
    idle, peak, after = float(r["idle"]), float(r["peak"]), float(r["after"])  # type: ignore[arg-type]
    line = (
        f"idle {idle:.0f} MiB, peak {peak:.0f} MiB, {args.idle:g} s after {after:.0f} MiB ({after / idle - 1:+.0%}); "
        f"burst {r['seconds']:.1f} s, p50 {np.percentile(lat, 50):.1f} s, max {lat.max():.1f} s, statuses "
        f"{r['statuses']}"
    )
    print(line, flush=True)
    if args.no_write:
        return
    plot(r["samples"], r["marks"], DOCS / "memory-attention-burst.png")  # type: ignore[arg-type]
    settings = " ".join(args.env) or "defaults"
    body = f"""## Memory under a burst of /attention (bench/memory.py)

`python bench/memory.py --requests {args.requests} --idle {args.idle:g}` ({settings}, one ONNX Runtime thread) on
{machine()}, load average {os.getloadavg()[0]:.1f} at the end (other work shares the machine). {args.requests}
concurrent /attention requests at the default limits: a 256-token source force-decoding a 256-token target,
every kind of weight (answers of about 35 MB).

| idle RSS | peak RSS | RSS {args.idle:g} s after | burst | p50 | slowest | statuses |
|---|---|---|---|---|---|---|
| {idle:.0f} MiB | {peak:.0f} MiB | {after:.0f} MiB ({after / idle - 1:+.0%}) | {r["seconds"]:.1f} s | \
{np.percentile(lat, 50):.1f} s | {lat.max():.1f} s | {r["statuses"]} |

![RSS through the burst](memory-attention-burst.png)
"""
    write_section("memory", body)


if __name__ == "__main__":
    main()
