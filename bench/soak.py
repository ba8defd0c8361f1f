"""Soak: mixed load against `attnserve serve` for a given time, recording the server's resident memory, p50/p99
latency per window (a minute by default) and every error; a plot and a section of docs/BENCHMARKS.md.

Closed-loop clients each send, in a fixed random mix, a greedy text, a beam-4 text, a list of 8 texts or an
/attention request, and wait for the answer before sending the next. The goals over a long run: no error, resident
memory after the first window growing by less than 2 %, and the last window's p99 within 1.2× of the second's.

Resident memory is sampled every second. Its growth is read from each window's median, the level the process keeps;
a window's maximum adds whatever the requests in flight held at one instant (bounded by the memory budget), which
moves by a few percent from window to window with the chance coincidences of long requests.

    python bench/soak.py --seconds 600
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from common import CORPUS, DOCS, ROOT, attnserve_server, machine, texts, write_section

MIX = (("greedy", 0.55), ("beam", 0.15), ("list", 0.2), ("attention", 0.1))
GOALS = {"errors": 0, "rss_growth": 0.02, "p99_ratio": 1.2}  # the long run's


def body(kind: str, rng: random.Random, sentences: list[str]) -> tuple[str, dict[str, object]]:
    """The path and JSON body of one request of ``kind``."""
    pair = {"source": "en", "target": "ja"}
    if kind == "greedy":
        return "/translate", {"q": rng.choice(sentences), **pair}
    if kind == "beam":
        return "/translate", {"q": rng.choice(sentences), "beam_size": 4, **pair}
    if kind == "list":
        return "/translate", {"q": rng.sample(sentences, 8), **pair}
    return "/attention", {"q": rng.choice(sentences), **pair}


@dataclass
class Window:
    """One window of the run: latencies (s) of the answers that came in it, errors, RSS samples (MiB)."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        lat = np.asarray(self.latencies or [np.nan])
        return {
            "requests": len(self.latencies),
            "errors": len(self.errors),
            "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)),
            "rss_median": float(np.median(self.rss)) if self.rss else float("nan"),
            "rss_max": max(self.rss, default=float("nan")),
        }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def run_load(
    url: str, pid: int, sentences: list[str], clients: int, seconds: float, window: float
) -> list[Window]:
    """``clients`` closed loops for ``seconds``; what each ``window`` seconds saw."""
    import aiohttp

    windows = [Window() for _ in range(max(1, round(seconds / window)))]
    start = time.monotonic()
    stop = start + len(windows) * window

    def current() -> Window:
        return windows[min(int((time.monotonic() - start) / window), len(windows) - 1)]

    def sample() -> None:
        while time.monotonic() < stop:
            current().rss.append(rss_mb(pid))
            time.sleep(1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    kinds, weights = [k for k, _ in MIX], [w for _, w in MIX]

    async def client(http: aiohttp.ClientSession, seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop:
            path, payload = body(rng.choices(kinds, weights)[0], rng, sentences)
            t0 = time.perf_counter()
            try:
                async with http.post(path, json=payload) as r:
                    await r.read()
                    ok = r.status == 200
                    error = f"{path} {r.status}"
            except (aiohttp.ClientError, TimeoutError) as e:
                ok, error = False, f"{path} {type(e).__name__}"
            (current().latencies.append(time.perf_counter() - t0) if ok else current().errors.append(error))

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=aiohttp.TCPConnector(limit=clients)) as http:
        await asyncio.gather(*(client(http, seed) for seed in range(clients)))
    sampler.join()
    return windows


def verdict(summaries: list[dict[str, float]], goals: dict[str, float]) -> dict[str, object]:
    """The run's figures against ``goals``: errors, RSS growth after the first window (medians), last p99 / second
    p99."""
    errors = sum(int(s["errors"]) for s in summaries)
    growth = summaries[-1]["rss_median"] / summaries[0]["rss_median"] - 1
    ratio = summaries[-1]["p99"] / summaries[min(1, len(summaries) - 1)]["p99"]
    return {
        "errors": errors,
        "rss_growth": growth,
        "rss_max_growth": summaries[-1]["rss_max"] / summaries[0]["rss_max"] - 1,  # reported, not a goal
        "p99_ratio": ratio,
        "met": errors <= goals["errors"] and growth < goals["rss_growth"] and ratio <= goals["p99_ratio"],
    }


def plot(summaries: list[dict[str, float]], window: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [(i + 1) * window / 60 for i in range(len(summaries))]
    fig, (lat, mem) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    lat.plot(t, [s["p50"] * 1000 for s in summaries], marker="o", label="p50")
    lat.plot(t, [s["p99"] * 1000 for s in summaries], marker="o", label="p99")
    lat.set_ylabel("latency (ms)")
    lat.set_ylim(bottom=0)
    lat.legend()
    mem.plot(t, [s["rss_median"] for s in summaries], marker="o", color="tab:green", label="median")
    mem.plot(t, [s["rss_max"] for s in summaries], marker="o", color="tab:olive", label="max")
    mem.set_ylabel("server RSS (MiB)")
    mem.legend()
    mem.set_xlabel("minutes")
    lat.set_title("Soak: mixed load (greedy, beam 4, lists of 8, /attention)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# long: parse, run, summarize, plot and write, in order
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV whose first column is the source text")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--window", type=float, default=60, help="seconds per line of the table")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", type=Path, help="write the windows and the verdict here")
    ap.add_argument("--no-write", action="store_true", help="leave docs/ alone")
    args = ap.parse_args()
    sentences = texts(args.texts)
    if len(sentences) < 8:  # no corpus here: sentences from the docs, which the model has not seen either
        sentences = [s.strip() for s in (DOCS / "ARCHITECTURE.md").read_text().split(". ") if 10 < len(s) < 300]
    with attnserve_server(args.bundle, {"ATTNSERVE_THREADS": "1"}) as server:
        windows = asyncio.run(
            run_load(server.url, server.process.pid, sentences, args.clients, args.seconds, args.window)
        )
    summaries = [w.summary() for w in windows]
    result = verdict(summaries, GOALS)
    errors = sorted({e for w in windows for e in w.errors})
    print(json.dumps({"windows": summaries, **result, "error_kinds": errors}, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"windows": summaries, **result, "error_kinds": errors}))
    if args.no_write:
        return
    plot(summaries, args.window, DOCS / "soak.png")
    rows = "\n".join(
        f"| {(i + 1) * args.window / 60:g} | {s['requests']:.0f} | {s['errors']:.0f} | {s['p50'] * 1000:.0f} | "
        f"{s['p99'] * 1000:.0f} | {s['rss_median']:.0f} | {s['rss_max']:.0f} |"
        for i, s in enumerate(summaries)
    )
    average = os.getloadavg()
    body_ = f"""## Soak (bench/soak.py)

`python bench/soak.py --seconds {args.seconds:g}` — {args.clients} closed-loop clients, mixed load
({", ".join(f"{k} {w:.0%}" for k, w in MIX)}; list = 8 texts), {len(sentences)} source texts, one ONNX Runtime
thread, on {machine()}. Load average at the end {average[0]:.1f} / {average[1]:.1f} / {average[2]:.1f} (1 / 5 / 15 min;
other work shares these 2 cores).

| minute | answers | errors | p50 ms | p99 ms | RSS median MiB | RSS max MiB |
|---|---|---|---|---|---|---|
{rows}

Errors {result["errors"]} (goal 0); RSS growth after the first window (medians) {result["rss_growth"]:+.1%}
(goal < 2 %; maxima {result["rss_max_growth"]:+.1%}); last window's p99 / the second's {result["p99_ratio"]:.2f}
(goal ≤ 1.2): {"goals met" if result["met"] else "goals not met"}.

![soak](soak.png)
"""
    write_section("soak", body_)


if __name__ == "__main__":
    main()
