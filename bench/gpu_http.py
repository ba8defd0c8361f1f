"""The service over HTTP on one GPU: batch-1 latency, sentences/s with concurrent clients, and the GPU memory gauge.

Starts ``attnserve serve`` (through ``service.cli.main``: no installed console script needed) on a bundle with
``ATTNSERVE_PROVIDER`` (``--provider``: cuda; cpu, where the CPU stands in for the GPU) and, after a warm-up:

1. batch-1 latency: one client, one test sentence a request, each sent when the previous answer came;
2. throughput: ``--clients`` such clients at once (closed loop) for ``--seconds``: sentences/s and their latency;
3. /metrics: ``attnserve_gpu_memory_bytes`` (the device's used and total memory; absent on the CPU) and the
   execution provider that ``attnserve_model_info`` names.

Writes the figures as JSON (``--results``) and prints them as a table.

    python bench/gpu_http.py --results gpu_http.json
    python bench/gpu_http.py --provider cpu --latency-requests 20 --clients 4 --seconds 3 --results /tmp/http.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from common import CORPUS, ROOT, Server, free_port, texts
from load import percentile

METRIC = re.compile(r'^attnserve_gpu_memory_bytes\{kind="(\w+)"\} (\S+)$', re.M)
PROVIDER = re.compile(r'^attnserve_model_info\{[^}]*provider="(\w+)"', re.M)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV whose first column is the source text")
    ap.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE", help="more ATTNSERVE_* settings")
    ap.add_argument("--latency-requests", type=int, default=300)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the clients send")
    ap.add_argument("--results", type=Path, required=True, help="the figures as JSON")
    return ap.parse_args(argv)


def serve(args: argparse.Namespace) -> Server:
    """``attnserve serve`` of ``--bundle`` on a free loopback port with the provider and ``--setting``s."""
    port = free_port()
    attnserve = [sys.executable, "-c", "import sys; from service.cli.main import main; sys.exit(main())"]
    command = [*attnserve, "serve", "--bundle", str(args.bundle.resolve()), "--port", str(port)]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)  # keep what it adds
    env = {"ATTNSERVE_PROVIDER": args.provider, "ATTNSERVE_LOG_LEVEL": "warning", "PYTHONPATH": path}
    env |= dict(setting.split("=", 1) for setting in args.setting)
    return Server(command, port, env, ready_timeout=300)


def milliseconds(latencies: Sequence[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p95_ms": percentile(latencies, 95) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "mean_ms": statistics.fmean(latencies) * 1e3,
    }


def batch_one(url: str, sentences: list[str], n: int) -> dict[str, Any]:
    """``n`` requests of one sentence each, one after another on one connection."""
    latencies = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(n):
            body = {"q": sentences[i % len(sentences)], "source": "en", "target": "ja"}
            started = time.perf_counter()
            client.post("/translate", json=body).raise_for_status()
            latencies.append(time.perf_counter() - started)
    return {"requests": n, **milliseconds(latencies)}


async def closed_loop(url: str, sentences: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` clients, each sending its next sentence when its previous answer came, for ``seconds``."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as session:
        deadline = time.perf_counter() + seconds

        async def client(number: int) -> None:
            nonlocal errors
            k = number
            while time.perf_counter() < deadline:
                body = {"q": sentences[k % len(sentences)], "source": "en", "target": "ja"}
                k += clients
                started = time.perf_counter()
                answer = await session.post("/translate", json=body)
                if answer.status_code != 200:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client(number) for number in range(clients)))
        elapsed = time.perf_counter() - started
    return {
        "clients": clients,
        "seconds": elapsed,
        "sentences": len(latencies),
        "errors": errors,
        "sentences_per_s": len(latencies) / elapsed,
        **milliseconds(latencies),
    }


def read_metrics(text: str) -> dict[str, Any]:
    """The GPU memory gauge (None where the server exports none: on the CPU) and the providers, from /metrics."""
    memory = {kind: float(value) for kind, value in METRIC.findall(text)}
    return {"gpu_memory_bytes": memory or None, "provider": sorted(set(PROVIDER.findall(text)))}


def table(results: dict[str, Any]) -> str:
    latency, load, memory = results["batch_one"], results["closed_loop"], results["metrics"]["gpu_memory_bytes"]
    used = f"{memory['used'] / 2**20:,.0f} of {memory['total'] / 2**20:,.0f} MiB" if memory else "none (not on CUDA)"
    return "\n".join(
        [
            f"provider: {', '.join(results['metrics']['provider'])}",
            "",
            "| measurement | value |",
            "|---|---|",
            f"| batch 1: p50 / p95 / p99 latency ({latency['requests']} requests) | "
            f"{latency['p50_ms']:.1f} / {latency['p95_ms']:.1f} / {latency['p99_ms']:.1f} ms |",
            f"| {load['clients']} clients: sentences/s | {load['sentences_per_s']:,.1f} |",
            f"| {load['clients']} clients: p50 / p95 latency | {load['p50_ms']:.1f} / {load['p95_ms']:.1f} ms |",
            f"| {load['clients']} clients: errors | {load['errors']} |",
            f"| GPU memory used (attnserve_gpu_memory_bytes) | {used} |",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sentences = [s for s in texts(args.texts, 2000) if s.strip()]
    with serve(args) as server:
        batch_one(server.url, sentences, 5)  # warm-up: the first calls of each shape
        results: dict[str, Any] = {
            "provider": args.provider,
            "settings": args.setting,
            "sentences": len(sentences),
            "batch_one": batch_one(server.url, sentences, args.latency_requests),
            "closed_loop": asyncio.run(closed_loop(server.url, sentences, args.clients, args.seconds)),
            "metrics": read_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text),
        }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results), flush=True)
    return 0 if results["closed_loop"]["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
