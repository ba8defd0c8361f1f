"""The serving overhead: ``attnserve serve`` over HTTP on one core against CTranslate2 called directly on that core.

The server runs pinned to core 0 (``taskset -c 0``, one decoding thread of one ONNX Runtime thread), this process
(the load generator: 32 closed-loop aiohttp clients, each sending one sentence per request) pinned to core 1.
CTranslate2 runs ``Translator.translate_batch`` in batches of 32 sorted by length on core 0, on the same weights
(``attnserve export-marian`` → ``ct2-transformers-converter``, bench/engines.py's :func:`~engines.prepare`), in a
subprocess of bench/peers.py (``--engine``), as does attnserve's runner alone (no HTTP, no scheduler) for
reference. The service without HTTP runs too: its engine started as the server starts it, in a process of its own
on core 0 with as many closed-loop callers (bench/in_process.py). 300 test sentences, greedy, default settings,
float32 and int8; the clients walk the sentences in turn, so every sentence is answered once in the first 300
requests and repeats after.

Each round runs, in turn: CTranslate2 float32, attnserve float32, CTranslate2 int8, attnserve int8, attnserve
float32 with ``max_batch_size`` 1 (the batching gain), both engines on the texts without spans (the service masks
placeholders and decodes those texts with attention: service/text/), the runner alone, the service without HTTP
(float32, int8, int8 on the texts without spans), with ``--cache`` attnserve float32 with its response cache on,
with ``--event-loop`` the event loop's own cost: a server that answers each text from a memo of the runner's
results (bench/memo_server.py), alone and beside a decoding loop that answers nobody, and with ``--mixed-rate`` the
mixed load of bench/peers.py (open loop, 10 % long requests; its 1,000 test sentences; the server free to use every
core, as there) with continuous batching on, then off. Ratios are those of each round, median of ``--rounds``; each
server's peak resident memory is its VmHWM. attnserve's answers to texts without spans are compared with
CTranslate2's float32 outputs, detokenized (identical expected).
``--profile NAME`` adds a py-spy profile of the float32 server (``--profile-variant int8``: the int8 one) under the
same load, with each thread's CPU time and, where Linux's perf is installed, the CPU by thread and library, and
writes it to its own section (``overhead-profile-NAME``); ``--rounds 0 --attnserve OTHER/.venv/bin/attnserve``
profiles another checkout's server alone.

    python bench/overhead.py
    python bench/overhead.py --profile after --cache
    python bench/overhead.py --cache --event-loop --mixed-rate 174.2
    python bench/overhead.py --sentences 40 --seconds 2 --rounds 1 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from common import CORPUS, DOCS, PEERS, ROOT, Server, free_port, machine, pairs, versions, write_section
from engines import SERVICE_MAX_LENGTH, prepare
from load import mixed_load
from profile_table import profile_section, record_command, record_profile, thread_cpu

if TYPE_CHECKING:
    from service.runtime.bundle import Bundle

SERVER_CORE, CLIENT_CORE = "0", "1"
ALL_CORES = os.sched_getaffinity(0)  # before main pins the load generator
ONE_THREAD = {"ATTNSERVE_DECODE_THREADS": "1", "ATTNSERVE_THREADS": "1", "OMP_NUM_THREADS": "1"}


def add_load_arguments(ap: argparse.ArgumentParser, seconds: float) -> None:
    """The load's options, shared with bench/alternate.py: the bundle, the sentences, the clients, a run's seconds."""
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV: source, reference (default: the test split)")
    ap.add_argument("--sentences", type=int, default=300, help="test sentences (a deterministic sample)")
    ap.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    ap.add_argument("--seconds", type=float, default=seconds, help="seconds of load per server run")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_load_arguments(ap, seconds=10)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median); 0: only --profile")
    ap.add_argument("--cache", action="store_true", help="also attnserve float32 with the response cache on")
    ap.add_argument("--event-loop", action="store_true",
                    help="also a server answering from a memo, alone and beside decoding (memo_server.py)")  # fmt: skip
    ap.add_argument("--mixed-rate", type=float, metavar="RATE",
                    help="also bench/peers.py's mixed load at RATE/s, continuous batching on and off")  # fmt: skip
    ap.add_argument("--mixed-seconds", type=float, default=30, help="seconds of arrivals of a mixed-load run")
    ap.add_argument("--profile", metavar="NAME", help="profile the server (py-spy, perf) into its own section")
    ap.add_argument("--profile-variant", choices=("float32", "int8"), default="float32",
                    help="the graphs of the server that --profile profiles")  # fmt: skip
    ap.add_argument("--runner-beam", type=int, metavar="N", help="with --profile: also the runner alone at beam N")
    ap.add_argument("--attnserve", type=Path, default=Path(sys.executable).with_name("attnserve"),
                    help="the attnserve command to serve (another checkout's, to profile it)")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None, help="keep conversions here (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md goes here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    return ap.parse_args(argv)


@dataclass
class Run:
    """One kind of run across the rounds: sentences/s of each round, and the texts it gave."""

    label: str
    rates: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    outputs: dict[int, str] = field(default_factory=dict)  # sentence index -> translation (first answer)
    tokens: list[list[int]] = field(default_factory=list)  # CTranslate2's, in sentence order
    loop_us: list[float] = field(default_factory=list)  # the event loop's CPU µs a request (/proc)
    decode_share: list[float] = field(default_factory=list)  # the other threads' (decoding) share of the CPU
    encode_us: list[float] = field(default_factory=list)  # ONNX Runtime's encoder calls, wall µs a request
    decode_us: list[float] = field(default_factory=list)  # its decoder steps, wall µs a request
    rows: list[float] = field(default_factory=list)  # rows a decoding step
    rss_mb: list[float] = field(default_factory=list)  # the server's peak resident memory (VmHWM)
    short_p99: list[float] = field(default_factory=list)  # mixed load: short requests' p99, s
    long_p99: list[float] = field(default_factory=list)  # mixed load: long requests' p99, s
    errors: int = 0  # mixed load: failed requests, over the rounds
    requests: int = 0  # mixed load: requests sent, over the rounds

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def pinned(core: str, command: list[str]) -> list[str]:
    return ["taskset", "-c", core, *command]


def offline_run(work: Path, engine: str, compute: str, run: Run, passes: int = 3) -> None:
    """``passes`` runs of an offline engine (``ctranslate2``, or ``attnserve``'s runner alone), each a process of
    its own doing one pass over ``work``'s sentences in batches of 32 sorted by length on the server's core; their
    median rate into ``run``. A pass lasts about a second: one alone would stand or fall with a neighbour's burst."""
    command = [sys.executable, str(PEERS), "--engine", engine, "--compute", compute]
    command += ["--beam", "1", "--threads", "1", "--work", str(work)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rates = []
    for _ in range(passes):
        proc = subprocess.run(pinned(SERVER_CORE, command), capture_output=True, text=True, env=env, cwd=ROOT)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{engine} {compute} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(lines[-1][len("RESULT ") :])
        rates.append(len(result["tokens"]) / result["seconds"])
        run.tokens = run.tokens or result["tokens"]
    run.rates.append(statistics.median(rates))
    print(f"  {run.label}: {run.rates[-1]:.1f}/s (passes {', '.join(f'{r:.0f}' for r in rates)})", flush=True)


def in_process_run(work: Path, env: dict[str, str], seconds: float, run: Run) -> None:
    """The service without HTTP (bench/in_process.py) on ``work``'s texts, pinned to the server's core, loaded for
    ``--seconds``; into ``run``."""
    command = [sys.executable, str(IN_PROCESS), "--work", str(work), "--seconds", str(seconds)]
    env = {**os.environ, "ATTNSERVE_LOG_LEVEL": "warning", **ONE_THREAD, **env}
    proc = subprocess.run(pinned(SERVER_CORE, command), capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{run.label} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    run.rates.append(result["rate"])
    run.outputs = run.outputs or {int(i): text for i, text in result["outputs"].items()}
    print(f"  {run.label}: {run.rates[-1]:.1f}/s", flush=True)


def attnserve_server(
    bundle: Path | None, env: dict[str, str], attnserve: list[str], cores: str = SERVER_CORE, ready_timeout: float = 120
) -> Server:
    """``attnserve serve`` (the command ``attnserve``) of ``bundle`` (None: what ``env`` names) pinned to ``cores``,
    the server's core by default."""
    port = free_port()
    served = ["--bundle", str(bundle)] if bundle is not None else []
    command = pinned(cores, [*attnserve, "serve", *served, "--port", str(port)])
    return Server(command, port, {"ATTNSERVE_LOG_LEVEL": "warning", **ONE_THREAD, **env}, ready_timeout)


async def closed_loop(
    url: str, bodies: list[dict[str, Any]], clients: int, seconds: float, timeout: float = 120
) -> tuple[float, float, dict[int, str]]:
    """``clients`` loops, each sending the next sentence in turn and waiting for its answer (at most ``timeout``
    seconds), for ``seconds``: (answers/s, median latency in s, the first translation of each sentence)."""
    import aiohttp

    outputs: dict[int, str] = {}
    latencies: list[float] = []
    errors: list[int] = []
    turn = 0
    stop = time.perf_counter() + seconds

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal turn
        while time.perf_counter() < stop:
            i, turn = turn % len(bodies), turn + 1
            t0 = time.perf_counter()
            try:
                async with http.post("/translate", json=bodies[i]) as r:
                    answer = await r.json()
                    r.raise_for_status()
            except aiohttp.ServerDisconnectedError:  # a kept-alive connection closed as it was reused
                errors.append(i)
                continue
            latencies.append(time.perf_counter() - t0)
            outputs.setdefault(i, answer["translatedText"])

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=timeout), connector=connector) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    if len(errors) > len(latencies) // 100:
        raise RuntimeError(f"{len(errors)} requests of {len(errors) + len(latencies)} found the connection closed")
    return len(latencies) / elapsed, statistics.median(latencies), outputs


def serve_and_load(
    bundle: Path,
    env: dict[str, str],
    bodies: list[dict[str, Any]],
    args: argparse.Namespace,
    run: Run,
    attnserve: list[str],
) -> None:
    """Start a server (``attnserve``: the command), warm it up with one pass over the sentences, load it for
    ``--seconds``; into ``run``."""
    with attnserve_server(bundle, env, attnserve) as server:
        asyncio.run(closed_loop(server.url, bodies, args.clients, min(2.0, args.seconds)))
        pid = str(server.process.pid)  # the main thread's id: the event loop's
        steps_before = step_totals(server.url)
        before, start = thread_cpu(server.process.pid), time.perf_counter()
        rate, p50, outputs = asyncio.run(closed_loop(server.url, bodies, args.clients, args.seconds))
        seconds, after = time.perf_counter() - start, thread_cpu(server.process.pid)
        steps = {k: v - steps_before[k] for k, v in step_totals(server.url).items()}
        rss = server.peak_rss_mb()
    if rss is not None:
        run.rss_mb.append(rss)
    loop = after[pid] - before.get(pid, 0.0)
    others = sum(after[t] - before.get(t, 0.0) for t in after if t != pid)
    run.rates.append(rate)
    run.p50.append(p50)
    run.loop_us.append(loop / (rate * seconds) * 1e6)
    run.decode_share.append(others / max(loop + others, 1e-9))
    decoding = ""  # (a server that answers from its cache decodes nothing)
    if steps["steps"]:
        answers = rate * seconds
        run.encode_us.append(steps["encode"] / answers * 1e6)
        run.decode_us.append(steps["decode"] / answers * 1e6)
        run.rows.append(steps["rows"] / steps["steps"])
        decoding = (f", encoder {run.encode_us[-1]:.0f} µs and decoder {run.decode_us[-1]:.0f} µs a request, "
                    f"{run.rows[-1]:.1f} rows a step")  # fmt: skip
    if not run.outputs:
        run.outputs = outputs
    print(f"  {run.label}: {rate:.1f}/s, p50 {p50 * 1000:.0f} ms, event loop {run.loop_us[-1]:.0f} µs a request, "
          f"other threads {run.decode_share[-1]:.0%} of the CPU{decoding}", flush=True)  # fmt: skip


@contextmanager
def all_cores() -> Iterator[None]:
    """This process (and the servers it starts meanwhile) free to run on every core, then pinned back."""
    pinned_to = os.sched_getaffinity(0)
    os.sched_setaffinity(0, ALL_CORES)
    try:
        yield
    finally:
        os.sched_setaffinity(0, pinned_to)


def mixed_run(bundle: Bundle, mixed: list[tuple[str, list[int]]], args: argparse.Namespace, setting: str,
              run: Run) -> None:  # fmt: skip
    """bench/peers.py's mixed load (:func:`load.mixed_load`) of ``mixed`` (sentences and their token ids) at
    ``--mixed-rate``, ``ATTNSERVE_CONTINUOUS_BATCHING`` at ``setting``, one decoding thread, as that bench runs it:
    the server unpinned; into ``run``."""
    sentences, lengths = [s for s, _ in mixed], [len(ids) for _, ids in mixed]
    with all_cores():
        result = mixed_load(bundle, sentences, lengths, args.mixed_rate, args.mixed_seconds, 1,
                            token_limit(bundle), 60, (setting,))[setting]  # fmt: skip
    short, long, every = result["short"], result["long"], result["all"]
    run.rates.append(every.achieved)
    run.p50.append(short.p50)
    run.short_p99.append(short.p99)
    run.long_p99.append(long.p99)
    run.errors += every.errors
    run.requests += every.n
    print(f"  {run.label}: short p50 {short.p50 * 1000:.0f} ms, p99 {short.p99 * 1000:.0f} ms, long p99 "
          f"{long.p99 * 1000:.0f} ms, {every.errors} errors of {every.n}", flush=True)  # fmt: skip


def step_totals(url: str) -> dict[str, float]:
    """The server's totals so far from its /metrics: ONNX Runtime seconds in encoder calls and in decoder steps
    (wall time: on one core it includes what the event loop ran meanwhile), decoding steps, and rows over them."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"encode": 0.0, "decode": 0.0, "steps": 0.0, "rows": 0.0}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "attnserve_inference_seconds_sum":
                out[sample.labels["stage"]] += sample.value
            elif sample.name == "attnserve_batch_size_sum":
                out["rows"] += sample.value
            elif sample.name == "attnserve_batch_size_count":
                out["steps"] += sample.value
    return out


@dataclass(frozen=True)
class Setup:
    bundle: Path  # the bundle with float32 and int8 graphs
    work: Path
    sentences: list[str]
    bodies: list[dict[str, Any]]
    plain: list[bool]  # per sentence: no span (decoded as it is)
    tokens: list[int]  # per sentence: its source's tokens, unmasked
    mixed: list[tuple[str, list[int]]]  # the mixed load's sentences (bench/peers.py's sample) and their token ids


PLAIN = "texts without spans"
MEMO = "attnserve float32, answers from memory"
MEMO_SERVER = Path(__file__).with_name("memo_server.py")
IN_PROCESS = Path(__file__).with_name("in_process.py")
NO_HTTP = "engine in process, no HTTP"
MIXED = "attnserve float32, mixed load"
MIXED_SENTENCES = 1000  # bench/peers.py's sample, so that its mixed-load figures compare


def plan(args: argparse.Namespace, setup: Setup) -> list[tuple[str, Callable[[Run], None]]]:
    """One round's runs in order, each (name, what runs it): CTranslate2 just before the attnserve server it is
    compared with; then the batching gain, the texts without spans (both engines) and, with ``--cache``, the cache."""

    def ct2(compute: str, work: Path, engine: str = "ctranslate2") -> Callable[[Run], None]:
        return lambda run: offline_run(work, engine, compute, run)

    def server(
        env: dict[str, str], bodies: list[dict[str, Any]], memo: list[str] | None = None
    ) -> Callable[[Run], None]:
        # with ``memo`` (its options), a server that answers from a memo
        attnserve = [str(args.attnserve)] if memo is None else [sys.executable, str(MEMO_SERVER), *memo]
        return lambda run: serve_and_load(setup.bundle, env, bodies, args, run, attnserve)

    plain = [b for b, p in zip(setup.bodies, setup.plain, strict=True) if p]
    steps = [
        ("CTranslate2 float32", ct2("float32", setup.work)),
        ("attnserve float32", server({}, setup.bodies)),
        ("CTranslate2 int8", ct2("int8", setup.work)),
        ("attnserve int8", server({"ATTNSERVE_GRAPH_VARIANT": "int8"}, setup.bodies)),
        ("attnserve float32, max_batch_size 1", server({"ATTNSERVE_MAX_BATCH_SIZE": "1"}, setup.bodies)),
        (f"CTranslate2 float32, {PLAIN}", ct2("float32", setup.work / "plain")),
        (f"attnserve float32, {PLAIN}", server({}, plain)),
        (f"CTranslate2 int8, {PLAIN}", ct2("int8", setup.work / "plain")),
        (f"attnserve int8, {PLAIN}", server({"ATTNSERVE_GRAPH_VARIANT": "int8"}, plain)),
    ]
    steps += [  # where the service's decoding thread stands against the runner called directly
        ("attnserve runner float32, no HTTP", ct2("float32", setup.work, "attnserve")),
        (f"attnserve runner float32, no HTTP, {PLAIN}", ct2("float32", setup.work / "plain", "attnserve")),
    ]
    for variant, work, texts in (
        ("float32", setup.work, ""),
        ("int8", setup.work, ""),
        ("int8", setup.work / "plain", f", {PLAIN}"),
    ):
        env = {"ATTNSERVE_GRAPH_VARIANT": variant}  # what a request costs once HTTP is gone
        steps.append((f"attnserve {variant}, {NO_HTTP}{texts}", partial(in_process_run, work, env, args.seconds)))
    if args.cache:
        steps.append(("attnserve float32, cache on", server({"ATTNSERVE_CACHE_MB": "16"}, setup.bodies)))
    if args.event_loop:  # the event loop's own cost a request, then beside decoding that answers nobody
        steps.append((MEMO, server({}, setup.bodies, [])))
        steps.append((f"{MEMO}, beside a decoding loop", server({}, setup.bodies, ["--beside-decoding"])))
    if args.mixed_rate:
        from service.runtime.bundle import load_bundle

        bundle = load_bundle(setup.bundle, verify=False)
        for setting, batching in (("true", "continuous"), ("false", "request-level")):
            run_mixed = partial(mixed_run, bundle, setup.mixed, args, setting)
            steps.append((f"{MIXED}, {batching} batching", run_mixed))
    return steps


def rounds(args: argparse.Namespace, setup: Setup) -> dict[str, Run]:
    """Every run of every round, interleaved; CTranslate2 float32's outputs detokenized for the comparison."""
    steps = plan(args, setup)
    runs = {name: Run(name) for name, _ in steps}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds} (load average {os.getloadavg()[0]:.2f})", flush=True)
        for name, start in steps:
            start(runs[name])
    ct2 = runs["CTranslate2 float32"]
    ct2.outputs = dict(enumerate(detokenize(setup.bundle, ct2.tokens)))
    return runs


def runner_profile(work: Path, beam: int, name: str, command: str) -> str:
    """attnserve's runner alone (bench/peers.py ``--engine attnserve``, float32, one thread) at ``beam`` on the
    server's core under py-spy, from loading to the end of its pass over the sentences."""
    engine = [sys.executable, str(PEERS), "--engine", "attnserve", "--compute", "float32", "--beam", str(beam)]
    engine += ["--threads", "1", "--work", str(work)]
    profile = record_command(pinned(SERVER_CORE, engine))
    return profile_section(profile, name, command, f"the runner alone, float32, beam {beam}, one thread")


def detokenize(bundle_dir: Path, tokens: list[list[int]]) -> list[str]:
    from service.runtime.bundle import load_bundle

    tokenizer = load_bundle(bundle_dir, verify=False).tokenizer
    return [tokenizer.decode(t) for t in tokens]


def plain_texts(bundle_dir: Path, sentences: list[str]) -> list[bool]:
    """Which sentences the service decodes as they are; the others have spans (placeholders, markup) that it masks
    and places by attention (service/text/), so their answers are not the raw model's."""
    from service.runtime.bundle import load_bundle
    from service.settings import Settings
    from service.text.pipeline import TextPipeline

    bundle = load_bundle(bundle_dir, verify=False)
    split = Settings(_env_file=None).sentence_split_chars
    pipeline = TextPipeline(bundle.tokenizer, bundle.source_lang, split)
    return [pipeline.plain(s) for s in sentences]


def identity(runs: dict[str, Run], plain: list[bool], tokens: list[int]) -> str:
    """How many of attnserve's answers are CTranslate2's on the texts without spans, float32 and int8 (int8's
    graphs differ from CTranslate2's int8: not expected there), and how long the texts with spans are: the two sets
    differ in length, not only in spans."""
    ct2 = runs["CTranslate2 float32"].outputs
    kept = [i for i, p in enumerate(plain) if p]
    spanned = [i for i, p in enumerate(plain) if not p]
    line = (f"- {len(spanned)} of the {len(plain)} texts have spans (placeholders): the service masks them and "
            "places them back by cross-attention (service/text/), so their answers are left out of the "
            "comparison")  # fmt: skip
    if spanned and kept:
        with_spans, others = (statistics.mean(tokens[i] for i in group) for group in (spanned, kept))
        line += (f". They average {with_spans:.1f} source tokens against the others' {others:.1f} "
                 f"(all {len(plain)}: {statistics.mean(tokens):.1f})")  # fmt: skip
    lines = [line]
    for name in ("attnserve float32", "attnserve int8"):
        got = runs[name].outputs
        same = sum(got.get(i) == ct2[i] for i in kept)
        lines.append(f"- {name} answers identical to CTranslate2 float32's: {same}/{len(kept)}")
    return "\n".join(lines)


def table(runs: dict[str, Run]) -> str:
    """Each run's median rate, its rounds, and the ratios that the issue asks for."""
    rows = ["| run | sentences/s (median) | rounds | p50 ms | event loop CPU µs a request | decoding threads' CPU | "
            "encoder µs a request | decoder µs a request | rows a step | peak RSS MiB |"]  # fmt: skip
    rows.append("|---|---|---|---|---|---|---|---|---|---|")

    def median(values: list[float], form: str) -> str:
        return format(statistics.median(values), form) if values else "—"

    for run in runs.values():
        if run.short_p99:
            continue  # the mixed load: its own table
        rounds_ = ", ".join(f"{x:.1f}" for x in run.rates)
        p50 = median([x * 1000 for x in run.p50], ".0f")
        rows.append(f"| {run.label} | {run.rate:.1f} | {rounds_} | {p50} | {median(run.loop_us, '.0f')} | "
                    f"{median(run.decode_share, '.0%')} | {median(run.encode_us, '.0f')} | "
                    f"{median(run.decode_us, '.0f')} | {median(run.rows, '.1f')} | "
                    f"{median(run.rss_mb, '.0f')} |")  # fmt: skip
    return "\n".join(rows)


def mixed_table(args: argparse.Namespace, runs: dict[str, Run]) -> str:
    """The mixed load's short and long requests' latency, median over the rounds; empty without ``--mixed-rate``."""
    mixed = [run for run in runs.values() if run.short_p99]
    if not mixed:
        return ""
    rows = [f"Mixed load (bench/peers.py's, `load.mixed_load`): {args.mixed_rate:g} requests/s offered for "
            f"{args.mixed_seconds:g} s, 10 % long (the longest tenth of its {MIXED_SENTENCES} test sentences, long "
            "`max_length`) and 90 % short (the shorter half), the same arrivals for each run; one decoding thread, "
            "the server free to use both cores as in that bench.\n",
            "| run | short p99 ms (median) | rounds | short p50 ms | long p99 ms | achieved/s | errors |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for run in mixed:
        ms = [x * 1000 for x in run.short_p99]
        rows.append(f"| {run.label} | **{statistics.median(ms):.0f}** | {', '.join(f'{x:.0f}' for x in ms)} | "
                    f"{statistics.median(run.p50) * 1000:.0f} | {statistics.median(run.long_p99) * 1000:.0f} | "
                    f"{run.rate:.1f} | {run.errors}/{run.requests} |")  # fmt: skip
    return "\n".join(rows)


def ratio(runs: dict[str, Run], a: str, b: str) -> tuple[float, list[float]]:
    """Median over rounds of run ``a``'s rate over run ``b``'s in the same round, and each round's."""
    each = [x / y for x, y in zip(runs[a].rates, runs[b].rates, strict=True)]
    return statistics.median(each), each


def ratios(runs: dict[str, Run]) -> str:
    pairs_ = [
        ("attnserve float32 over HTTP / CTranslate2 float32", "attnserve float32", "CTranslate2 float32"),
        ("attnserve int8 over HTTP / CTranslate2 int8", "attnserve int8", "CTranslate2 int8"),
        ("batching gain (max_batch_size 32 / 1)", "attnserve float32", "attnserve float32, max_batch_size 1"),
        (f"{PLAIN}: attnserve float32 / CTranslate2 float32", f"attnserve float32, {PLAIN}",
         f"CTranslate2 float32, {PLAIN}"),
        (f"{PLAIN}: attnserve int8 / CTranslate2 int8", f"attnserve int8, {PLAIN}", f"CTranslate2 int8, {PLAIN}"),
        ("attnserve runner alone / CTranslate2, float32", "attnserve runner float32, no HTTP", "CTranslate2 float32"),
        (f"attnserve float32, {NO_HTTP} / CTranslate2 float32", f"attnserve float32, {NO_HTTP}", "CTranslate2 float32"),
        (f"attnserve int8, {NO_HTTP} / CTranslate2 int8", f"attnserve int8, {NO_HTTP}", "CTranslate2 int8"),
        (f"{PLAIN}: attnserve int8, {NO_HTTP} / CTranslate2 int8", f"attnserve int8, {NO_HTTP}, {PLAIN}",
         f"CTranslate2 int8, {PLAIN}"),
        (f"{PLAIN}: attnserve runner alone / CTranslate2, float32", f"attnserve runner float32, no HTTP, {PLAIN}",
         f"CTranslate2 float32, {PLAIN}"),
    ]  # fmt: skip
    if "attnserve float32, cache on" in runs:
        pairs_.append(("cache on: attnserve float32 / CTranslate2 float32", "attnserve float32, cache on",
                       "CTranslate2 float32"))  # fmt: skip
    lines = []
    for label, a, b in pairs_:
        median, each = ratio(runs, a, b)
        lines.append(f"- {label}: **{median:.2f}×** (rounds {', '.join(f'{x:.2f}' for x in each)})")
    return "\n".join(lines)


def token_limit(bundle: Bundle) -> int:
    """The service's token limit for a text of ``bundle`` (and its max_length)."""
    return min(SERVICE_MAX_LENGTH, bundle.spec.max_positions)


def held_out_sentences(bundle: Bundle, texts: Path, n: int) -> list[tuple[str, list[int]]]:
    """The first ``n`` sentences of ``texts`` that are not blank, those within :func:`token_limit`, with their
    token ids."""
    chosen = [(s, bundle.tokenizer.encode_source(s)) for s, _ in pairs(texts, n) if s.strip()]
    return [(s, ids) for s, ids in chosen if len(ids) <= token_limit(bundle)]


def translate_bodies(bundle: Bundle, sentences: list[str]) -> list[dict[str, Any]]:
    """/translate bodies, a sentence each."""
    pair = {"source": bundle.source_lang, "target": bundle.target_lang}
    return [{"q": s, **pair} for s in sentences]


def request_bodies(bundle_dir: Path, texts: Path, n: int) -> list[dict[str, Any]]:
    """/translate bodies of :func:`held_out_sentences`."""
    from service.runtime.bundle import load_bundle

    bundle = load_bundle(bundle_dir, verify=False)
    return translate_bodies(bundle, [s for s, _ in held_out_sentences(bundle, texts, n)])


def set_up(args: argparse.Namespace) -> Setup:
    """The converted weights and the sentences under the service's token limit (setup.json for the engines)."""
    from service.runtime.bundle import load_bundle

    work = args.work or Path(tempfile.mkdtemp(prefix="overhead-"))
    prepared = prepare(args.bundle, work)
    bundle = load_bundle(prepared.bundle, verify=False)
    kept = held_out_sentences(bundle, args.texts, args.sentences)
    setup: dict[str, Any] = {"bundle": str(prepared.bundle), "hf": str(prepared.hf), "ct2": str(prepared.ct2)}
    sentences = [s for s, _ in kept]
    mixed = held_out_sentences(bundle, args.texts, MIXED_SENTENCES) if args.mixed_rate else []
    setup |= {"sources": [ids for _, ids in kept], "texts": sentences, "max_length": token_limit(bundle)}
    (work / "setup.json").write_text(json.dumps(setup))
    plain = plain_texts(prepared.bundle, sentences)
    (work / "plain").mkdir(exist_ok=True)  # CTranslate2 on the texts without spans
    setup["sources"] = [ids for (_, ids), p in zip(kept, plain, strict=True) if p]
    setup["texts"] = [s for s, p in zip(sentences, plain, strict=True) if p]
    (work / "plain" / "setup.json").write_text(json.dumps(setup))
    lengths = [len(ids) for _, ids in kept]
    return Setup(prepared.bundle, work, sentences, translate_bodies(bundle, sentences), plain, lengths, mixed)


def section(args: argparse.Namespace, command: str, setup: Setup, runs: dict[str, Run], load: list[float]) -> str:
    return f"""## Serving overhead: HTTP on one core against CTranslate2 called directly (bench/overhead.py)

`{command}`

{machine()}; {versions("onnxruntime", "ctranslate2", "uvicorn", "fastapi")}. Server and CTranslate2 pinned to
core {SERVER_CORE}, the load generator to core {CLIENT_CORE}; {args.clients} closed-loop clients, one sentence a
request; {len(setup.sentences)} test sentences, greedy, default settings; {args.seconds:g} s of load a server run
after a warm-up; median of {args.rounds} interleaved rounds (an offline engine: the median of 3 passes a round).
Load average (1 min) {load[0]:.2f} before, {load[1]:.2f} after: other work on the machine's cores makes single
figures noisy, the ratios less so. Event loop CPU: the server's main thread's CPU time (/proc) over the answers it
gave; decoding threads' CPU: the other threads' share of the server's CPU time (the batching loops, with ONNX
Runtime running on them). Encoder and decoder µs a request: the wall time of ONNX Runtime's encoder calls and
decoding steps over the answers (the server's `attnserve_inference_seconds`; on one core it includes what the event
loop ran meanwhile); rows a step: `attnserve_batch_size`; peak RSS: the server process's VmHWM at the end of its
run.

{table(runs)}

{ratios(runs)}
{identity(runs, setup.plain, setup.tokens)}

{mixed_table(args, runs)}
"""


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.sched_setaffinity(0, {int(CLIENT_CORE)})  # the load generator; servers and CTranslate2 run on SERVER_CORE
    setup = set_up(args)
    words = argv if argv is not None else sys.argv[1:]
    command = "python bench/overhead.py " + " ".join(shlex.quote(a) for a in words)
    if args.rounds:
        before = os.getloadavg()[0]
        runs = rounds(args, setup)
        body = section(args, command, setup, runs, [before, os.getloadavg()[0]])
        print("\n" + body, flush=True)
        if not args.no_write:
            write_section("overhead", body, args.out / "BENCHMARKS.md")
    if args.profile:
        variant = args.profile_variant
        env = {} if variant == "float32" else {"ATTNSERVE_GRAPH_VARIANT": variant}
        with attnserve_server(setup.bundle, env, [str(args.attnserve)]) as server:
            load = partial(closed_loop, server.url, setup.bodies, args.clients, args.seconds)
            recorded = record_profile(server, lambda: asyncio.run(load()))
        profile = profile_section(recorded, args.profile, command, f"the {variant} server under that load")
        print(profile, flush=True)
        if not args.no_write:
            write_section(f"overhead-profile-{args.profile}", profile, args.out / "BENCHMARKS.md")
    if args.profile and args.runner_beam:
        runner = runner_profile(setup.work, args.runner_beam, args.profile, command)
        print(runner, flush=True)
        if not args.no_write:
            write_section(f"overhead-profile-{args.profile}-runner", runner, args.out / "BENCHMARKS.md")


if __name__ == "__main__":
    main()
