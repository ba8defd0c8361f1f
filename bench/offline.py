"""Offline runs: each engine run in its own subprocess of bench/peers.py (``--engine``), repetitions interleaved."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    PEERS,
    ROOT,
    peak_rss_mb,
)
from engines import BATCH, Prepared, make_engine, translate

OFFLINE = (
    ("ctranslate2", "float32"),
    ("ctranslate2", "int8"),
    ("transformers", "float32"),
    ("attnserve", "float32"),
    ("attnserve", "int8"),
)
NAMES = {"ctranslate2": "CTranslate2", "transformers": "transformers", "attnserve": "attnserve runner"}


def engine_main(args: argparse.Namespace) -> None:
    """``--engine NAME``: load, warm up, time one pass over the sentences, print one ``RESULT {json}`` line."""
    setup = json.loads((args.work / "setup.json").read_text())
    sources: list[list[int]] = setup["sources"]
    t0 = time.perf_counter()
    engine = make_engine(args.engine, args.compute, args.threads[0], Prepared.read(args.work))
    load_seconds = time.perf_counter() - t0
    translate(engine, sources[:BATCH], args.beam, min(setup["max_length"], 16))  # warm-up
    t0 = time.perf_counter()
    tokens = translate(engine, sources, args.beam, setup["max_length"])
    seconds = time.perf_counter() - t0
    rss_mb = peak_rss_mb() or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result = {"seconds": seconds, "load_seconds": load_seconds, "peak_rss_mb": rss_mb, "tokens": tokens}
    print("RESULT " + json.dumps(result), flush=True)


@dataclass(frozen=True)
class Job:
    engine: str
    compute: str
    beam: int
    threads: int

    @property
    def label(self) -> str:
        return f"{NAMES[self.engine]} {self.compute} {'greedy' if self.beam == 1 else f'beam {self.beam}'}"


@dataclass
class JobResult:
    job: Job
    seconds: list[float] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    tokens: list[list[int]] = field(default_factory=list)
    deterministic: bool = True

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds)

    @property
    def target_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def run_job(job: Job, work: Path, timeout: float) -> dict[str, Any]:
    """One engine run in its own subprocess of this script.

    Raises:
        RuntimeError: the subprocess failed (its stderr's end is in the message).
    """
    command = [sys.executable, str(PEERS), "--engine", job.engine, "--compute", job.compute]
    command += ["--beam", str(job.beam), "--threads", str(job.threads), "--work", str(work)]
    env = {**os.environ, "OMP_NUM_THREADS": str(job.threads)}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{job.label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def run_offline(jobs: list[Job], work: Path, repeats: int, timeout: float) -> list[JobResult]:
    """Every job ``repeats`` times, interleaved (A, B, C, A, B, C, ...)."""
    from tqdm import tqdm

    results = [JobResult(job) for job in jobs]
    with tqdm(total=repeats * len(jobs), desc="offline", unit="run") as bar:
        for _ in range(repeats):
            for r in results:
                bar.set_postfix_str(f"{r.job.label}, {r.job.threads} thr")
                out = run_job(r.job, work, timeout)
                r.seconds.append(out["seconds"])
                r.peak_rss_mb = max(r.peak_rss_mb, out["peak_rss_mb"])
                if not r.tokens:
                    r.tokens = out["tokens"]
                elif r.tokens != out["tokens"]:
                    r.deterministic = False
                bar.update()
    return results


# ---------------------------------------------------------------------------------------------------------------
# HTTP: open-loop Poisson load.


def anchor_rate(job: Job, work: Path, n: int, timeout: float) -> float:
    """Sentences/s of one offline run of ``job`` now (CTranslate2's, around an HTTP sweep: :func:`http_ratios`)."""
    return n / run_job(job, work, timeout)["seconds"]
