"""attnserve beside its peers, in one run, on the same weights, sentences, decoding and threads.

Offline (no HTTP), each run in its own subprocess (``--engine``, so that its peak RSS is its own), repetitions
interleaved (A, B, C, A, B, C, ...) and the median reported, all in batches of 32 sentences sorted by length, greedy
and beam 4, with one ``max_length`` for every engine:

1. CTranslate2 ``Translator.translate_batch``, float32 and int8 (``compute_type`` at load time), on the bundle's
   weights: ``model.marian.export_marian`` writes a MarianMTModel directory, ``TransformersConverter`` converts it;
2. transformers ``MarianMTModel.generate`` on that directory (float32);
3. attnserve's runner alone: ``service.decoding.decode`` on a ``Runner``, float32 and the bundle's int8 variant
   (made in a copy with ``model.export.add_int8`` when the bundle has none).

Over HTTP on 127.0.0.1, open-loop Poisson arrivals at rising rates (the test sentences' own length mix), latency
measured from each request's scheduled send time (the load generator is aiohttp, in this process):

4. ``attnserve serve``;
5. a plain FastAPI + transformers service that answers one request at a time (``--serve-transformers``, greedy);

and a mixed load (10 % long requests, 90 % short) against attnserve with continuous batching on and off
(``ATTNSERVE_CONTINUOUS_BATCHING``). It checks that greedy float32 tokens are identical across engines, scores chrF
against the references (sacrebleu), prints the tables, and writes its section of docs/BENCHMARKS.md and the latency
plots into docs/ (``--out DIR`` elsewhere, ``--no-write`` into a temporary directory). Needs ``.[train,bench]``.

    python bench/peers.py --threads 1 2
    python bench/peers.py --bundle /tmp/tiny --sentences 8 --repeats 1 --rates 2 4 --load-seconds 2 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import httpx
from common import (
    CORPUS,
    DOCS,
    ROOT,
    Server,
    attnserve_server,
    free_port,
    machine,
    pairs,
    peak_rss_mb,
    versions,
    write_section,
)
from pydantic import BaseModel

if TYPE_CHECKING:
    from service.bundle import Bundle

BATCH = 32
OFFLINE = (
    ("ctranslate2", "float32"),
    ("ctranslate2", "int8"),
    ("transformers", "float32"),
    ("attnserve", "float32"),
    ("attnserve", "int8"),
)
NAMES = {"ctranslate2": "CTranslate2", "transformers": "transformers", "attnserve": "attnserve runner"}
SLO_S = 1.0  # the latency objective: p99 at most this
SERVICE_MAX_LENGTH = 256  # service.settings.Settings.max_length's default, the offline runs' max_length


# ---------------------------------------------------------------------------------------------------------------
# Engines: token ids in (ending with </s>), generated ids out (without </s>), batches sorted by length.


class BatchEngine(Protocol):
    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]: ...


def length_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices sorted by length (ties in input order), in chunks of ``size``: the batches every engine gets."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + size] for i in range(0, len(order), size)]


def translate(
    engine: BatchEngine, sources: list[list[int]], beam: int, max_length: int, batch_size: int = BATCH
) -> list[list[int]]:
    """Every source through ``engine`` in batches of ``batch_size`` sorted by length; outputs in input order."""
    out: list[list[int]] = [[] for _ in sources]
    for idx in length_batches([len(s) for s in sources], batch_size):
        for i, tokens in zip(idx, engine.batch([sources[i] for i in idx], beam, max_length), strict=True):
            out[i] = tokens
    return out


def strip_eos(tokens: Sequence[int], eos: int) -> list[int]:
    return list(tokens[:-1]) if tokens and tokens[-1] == eos else list(tokens)


class AttnserveEngine:
    """attnserve's runner without HTTP: ``decode(Runner(bundle, provider, threads, variant, io_binding, fast),
    requests)``, on the graphs /translate uses (float32 on the CPU: the fast decoder)."""

    def __init__(
        self,
        bundle_dir: Path,
        variant: str = "float32",
        threads: int = 1,
        provider: str = "cpu",
        io_binding: bool | None = None,
    ) -> None:
        from service.bundle import load_bundle
        from service.runner import Runner

        self.bundle = load_bundle(bundle_dir, verify=False)
        fast = variant == "float32" and provider == "cpu"  # what /translate runs (service.engine.Engine)
        self.runner = Runner(self.bundle, provider, threads, variant, io_binding, fast)  # type: ignore[arg-type]
        self.eos = self.bundle.spec.eos_id

    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]:
        from service.decoding import DecodeRequest, decode

        # No scores, like CTranslate2's translate_batch by default (return_scores=False): greedy skips the softmax.
        requests = [DecodeRequest(src=s, beam_size=beam, max_length=max_length, scores=False) for s in sources]
        return [strip_eos(r.hypotheses[0].tokens, self.eos) for r in decode(self.runner, requests)]


class CTranslate2Engine:
    """``ctranslate2.Translator`` on a converted model; it takes token strings, so ids go through the vocabulary.

    Its Marian converter drops ``<pad>`` (our last id) from the vocabulary, so the other ids stay the same, and it
    does not append ``</s>``: the sources keep ours.
    """

    def __init__(
        self,
        ct2_dir: Path,
        vocab: dict[str, int],
        compute_type: str = "float32",
        threads: int = 1,
        device: str = "cpu",
    ) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(ct2_dir), device=device, compute_type=compute_type, intra_threads=threads, inter_threads=1
        )
        self.ids = vocab
        self.pieces = {i: p for p, i in vocab.items()}
        self.unk = vocab.get("<unk>", 1)

    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]:
        results = self.translator.translate_batch(
            [[self.pieces[i] for i in s] for s in sources],
            max_batch_size=len(sources),  # the batch we were given (32 in the offline runs), sorted by length
            beam_size=beam,  # 1 = greedy search
            num_hypotheses=1,
            length_penalty=1.0,
            max_decoding_length=max_length,  # generated tokens, </s> included, as our max_length
            min_decoding_length=0,  # its default (1) would forbid </s> first; ours does not
            max_input_length=0,  # no truncation
            return_end_token=False,
        )
        return [[self.ids.get(p, self.unk) for p in r.hypotheses[0]] for r in results]


class TransformersEngine:
    """``MarianMTModel.generate`` on the exported directory (the common choice)."""

    def __init__(self, hf_dir: Path, threads: int = 1, device: str = "cpu", dtype: str = "float32") -> None:
        import torch
        from transformers import MarianMTModel

        if device == "cpu":
            torch.set_num_threads(threads)
        self.device = device
        model: Any = MarianMTModel.from_pretrained(hf_dir, dtype=getattr(torch, dtype))
        self.model = model.to(device).eval()
        self.pad = int(self.model.config.pad_token_id)
        self.eos = int(self.model.config.eos_token_id)

    def batch(self, sources: list[list[int]], beam: int, max_length: int) -> list[list[int]]:
        import torch

        S = max(len(s) for s in sources)
        ids = torch.full((len(sources), S), self.pad, dtype=torch.long)  # (B, S)
        mask = torch.zeros((len(sources), S), dtype=torch.long)
        for i, s in enumerate(sources):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                num_beams=beam,
                do_sample=False,
                max_new_tokens=max_length,
                num_return_sequences=1,
            )
        return [self._generated(row) for row in out.tolist()]

    def _generated(self, row: list[int]) -> list[int]:
        row = row[1:]  # the decoder start token
        if self.eos in row:
            row = row[: row.index(self.eos)]
        return [t for t in row if t != self.pad]  # padding after a finished row (pad is never generated)


# ---------------------------------------------------------------------------------------------------------------
# Preparation (torch, in the parent): int8 graphs, the MarianMTModel directory, the CTranslate2 model.


@dataclass(frozen=True)
class Prepared:
    bundle: Path  # has float32 and int8 graphs
    hf: Path  # MarianMTModel directory
    ct2: Path  # CTranslate2 model directory
    vocab: dict[str, int]  # piece -> id

    @classmethod
    def read(cls, work: Path) -> Prepared:
        setup = json.loads((work / "setup.json").read_text())
        hf = Path(setup["hf"])
        return cls(Path(setup["bundle"]), hf, Path(setup["ct2"]), json.loads((hf / "vocab.json").read_text()))


def prepare(bundle_dir: Path, work: Path, variants: Sequence[str] = ("int8",)) -> Prepared:
    """Make what the engines load, under ``work``; reused when ``work`` already holds them for this bundle.

    Args:
        bundle_dir: the bundle.
        work: a directory for a copy of the bundle with the ``variants`` it lacks, the MarianMTModel directory and
            the CTranslate2 model.
        variants: graph variants the bundle used must have (``int8``, ``float16``), made in the copy if missing.

    Raises:
        service.bundle.BundleError: the bundle is missing or corrupted.
    """
    import ctranslate2

    from model.export import ADD_VARIANT
    from model.marian import export_marian
    from service.bundle import load_bundle, sha256

    work.mkdir(parents=True, exist_ok=True)
    stamp = f"{bundle_dir.resolve()} {sha256(bundle_dir / 'manifest.json')}"
    if (work / "stamp").exists() and (work / "stamp").read_text() != stamp:
        for name in ("bundle", "marian", "ctranslate2"):
            shutil.rmtree(work / name, ignore_errors=True)
    (work / "stamp").write_text(stamp)
    bundle = load_bundle(bundle_dir)
    missing = [v for v in variants if v not in bundle.variants]
    if missing:
        copy = work / "bundle"
        if not (copy / "manifest.json").exists() or set(missing) - set(load_bundle(copy, verify=False).variants):
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(bundle_dir, copy)
            for variant in missing:
                ADD_VARIANT[variant](copy)
        bundle_dir = copy
    hf, ct2 = work / "marian", work / "ctranslate2"
    if not (hf / "config.json").exists():
        export_marian(bundle_dir, hf, force=True)
    if not (ct2 / "model.bin").exists():
        ctranslate2.converters.TransformersConverter(str(hf)).convert(str(ct2), force=True)
    vocab = json.loads((hf / "vocab.json").read_text())
    return Prepared(bundle_dir, hf, ct2, vocab)


def make_engine(name: str, compute: str, threads: int, prepared: Prepared) -> BatchEngine:
    """Load one engine on the CPU.

    Args:
        name: ``ctranslate2``, ``transformers`` or ``attnserve``.
        compute: ``float32`` or ``int8`` (not for transformers).
    """
    if name == "ctranslate2":
        return CTranslate2Engine(prepared.ct2, prepared.vocab, compute, threads)
    if name == "transformers":
        if compute != "float32":
            raise ValueError("the transformers engine runs float32 only")
        return TransformersEngine(prepared.hf, threads)
    if name == "attnserve":
        return AttnserveEngine(prepared.bundle, compute, threads)
    raise ValueError(f"unknown engine {name!r}")


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
    command = [sys.executable, str(Path(__file__).resolve()), "--engine", job.engine, "--compute", job.compute]
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
    seconds from the start to the last answer. aiohttp, not httpx: on loopback it spends 0.2-0.3 ms of CPU a
    request against httpx's 1.3-12 ms (measured here), CPU the server on the same machine would lose.

    The objects this process already holds (torch, transformers, the bundle) are frozen out of the garbage
    collector's way for the run: its full collections paused the load generator, and the latencies counted the
    pauses (mixed load, the short requests' p99: 178-211 ms with them, 89-93 ms frozen, 66-100 ms in a process
    that never imported torch; measured here)."""
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


class TranslateBody(BaseModel):
    q: str
    source: str = "auto"
    target: str = ""
    max_length: int | None = None


def serve_transformers(hf_dir: Path, port: int, threads: int) -> None:
    """``--serve-transformers DIR --port P``: a plain FastAPI + transformers service, one request at a time."""
    import threading

    import torch
    import uvicorn
    from fastapi import FastAPI
    from transformers import MarianMTModel, MarianTokenizer

    torch.set_num_threads(threads)
    model = MarianMTModel.from_pretrained(hf_dir).eval()
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)
    max_positions = int(model.config.max_position_embeddings)
    lock = threading.Lock()
    app = FastAPI()

    @app.get("/readyz")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/translate")
    def translate_one(body: TranslateBody) -> dict[str, str]:
        with lock, torch.inference_mode():  # one request at a time
            enc = tokenizer(body.q, return_tensors="pt")
            n = body.max_length or min(SERVICE_MAX_LENGTH, 2 * enc.input_ids.shape[1] + 10)  # attnserve's default
            out = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=min(n, max_positions))
        return {"translatedText": tokenizer.decode(out[0], skip_special_tokens=True)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def transformers_server(hf_dir: Path, threads: int) -> Server:
    port = free_port()
    command = [sys.executable, str(Path(__file__).resolve()), "--serve-transformers", str(hf_dir)]
    command += ["--port", str(port), "--threads", str(threads)]
    return Server(command, port, {"OMP_NUM_THREADS": str(threads)})


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
) -> dict[str, dict[str, LoadPoint]]:
    """10 % long requests (the longest tenth of the sentences, ``max_length=long_max_length``) and 90 % short ones
    (the shorter half), one plan, sent to attnserve with continuous batching on, then off."""
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
    for setting in ("true", "false"):
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


def shown(path: Path) -> str:
    """A path relative to the repository when it is inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def fmt_ms(seconds: float) -> str:
    return "∞" if math.isinf(seconds) else "—" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def chrf(hypotheses: list[str], references: list[str | None]) -> float | None:
    if not hypotheses or any(r is None for r in references):
        return None
    import sacrebleu

    return float(sacrebleu.CHRF().corpus_score(hypotheses, [[r or "" for r in references]]).score)


def offline_table(results: list[JobResult], bundle: Bundle, references: list[str | None], n: int) -> str:
    by_key = {(r.job.engine, r.job.compute, r.job.beam, r.job.threads): r for r in results}
    rows = []
    for r in results:
        j = r.job
        tps = r.target_tokens / r.median_seconds
        base = by_key.get(("ctranslate2", j.compute if j.compute == "int8" else "float32", j.beam, j.threads))
        ratio = f"{tps / (base.target_tokens / base.median_seconds):.2f}" if base else "—"
        score = chrf([bundle.tokenizer.decode(t) for t in r.tokens], references)
        note = "" if r.deterministic else " (outputs varied between repeats)"
        rows.append(
            f"| {NAMES[j.engine]} | {j.compute} | {'greedy' if j.beam == 1 else f'beam {j.beam}'} | {j.threads} | "
            f"{tps:,.0f} | {n / r.median_seconds:.1f} | {ratio} | {r.peak_rss_mb:.0f} | "
            f"{'—' if score is None else f'{score:.1f}'}{note} |"
        )
    head = (
        "| engine | compute | decoding | threads | target tokens/s | sentences/s | × CTranslate2 | peak RSS MB "
        "| chrF |\n|---|---|---|---|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(rows)


def identity_report(results: list[JobResult], bundle: Bundle, sentences: list[str], threads: int) -> str:
    """Fractions of identical outputs between engines (float32; int8 against its own float32), a few differences."""
    got = {(r.job.engine, r.job.compute, r.job.beam): r.tokens for r in results if r.job.threads == threads}
    lines: list[str] = []
    examples: list[str] = []
    comparisons = [
        (("attnserve", "float32"), ("ctranslate2", "float32")),
        (("attnserve", "float32"), ("transformers", "float32")),
        (("ctranslate2", "float32"), ("transformers", "float32")),
        (("attnserve", "int8"), ("attnserve", "float32")),
        (("ctranslate2", "int8"), ("ctranslate2", "float32")),
        (("attnserve", "int8"), ("ctranslate2", "int8")),
    ]
    for beam in sorted({b for _, _, b in got}):
        for a, b in comparisons:
            ta, tb = got.get((*a, beam)), got.get((*b, beam))
            if ta is None or tb is None:
                continue
            same = sum(x == y for x, y in zip(ta, tb, strict=True))
            decoding = "greedy" if beam == 1 else f"beam {beam}"
            name = f"{NAMES[a[0]]} {a[1]} vs {NAMES[b[0]]} {b[1]}, {decoding}"
            lines.append(f"- {name}: **{same}/{len(ta)}** identical ({same / max(len(ta), 1):.1%})")
            if beam == 1 and a[1] == b[1] == "float32":
                for i, (x, y) in enumerate(zip(ta, tb, strict=True)):
                    if x != y and sum(e.startswith(f"  - {name}") for e in examples) < 3:
                        at = next(
                            (k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y))
                        )
                        examples.append(
                            f"  - {name}: {sentences[i][:60]!r} differs at token {at}: "
                            f"{bundle.tokenizer.decode(x)[:60]!r} vs {bundle.tokenizer.decode(y)[:60]!r}"
                        )
    if examples:
        lines += ["- A few greedy float32 differences:", *examples]
    return "\n".join(lines)


def http_tables(curves: dict[tuple[str, int], tuple[list[LoadPoint], float | None]]) -> str:
    best_rows, curve_rows = [], []
    for (name, threads), (points, rss) in curves.items():
        best = best_sustained(points)
        rss_text = "—" if rss is None else f"{rss:.0f}"
        if best is None:
            best_rows.append(
                f"| {name} | {threads} | none (p99 > 1 s from the lowest rate) | — | — | — | — | {rss_text} |"
            )
        else:
            best_rows.append(
                f"| {name} | {threads} | **{best.achieved:.1f}** | {best.offered:g} | {fmt_ms(best.p50)} | "
                f"{fmt_ms(best.p95)} | {fmt_ms(best.p99)} | {rss_text} |"
            )
        for p in points:
            curve_rows.append(
                f"| {name} | {threads} | {p.offered:g} | {p.achieved:.1f} | {fmt_ms(p.p50)} | {fmt_ms(p.p95)} | "
                f"{fmt_ms(p.p99)} | {p.errors}/{p.n} |"
            )
    return (
        "| server | threads | best sustained sentences/s (p99 ≤ 1 s) | at offered/s | p50 ms | p95 ms | p99 ms | "
        "peak RSS MB |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(best_rows) + "\n\nLatency against offered "
        "load (one request = one sentence; failed requests count as infinitely slow):\n\n"
        "| server | threads | offered/s | achieved/s | p50 ms | p95 ms | p99 ms | errors |\n"
        "|---|---|---|---|---|---|---|---|\n" + "\n".join(curve_rows)
    )


def anchor_rate(job: Job, work: Path, n: int, timeout: float) -> float:
    """Sentences/s of one offline run of ``job`` now (CTranslate2's, around an HTTP sweep: :func:`http_ratios`)."""
    return n / run_job(job, work, timeout)["seconds"]


def http_ratios(
    curves: dict[tuple[str, int], tuple[list[LoadPoint], float | None]],
    offline: list[JobResult],
    n: int,
    anchors: dict[tuple[str, int], tuple[float, float]] | None = None,
) -> str:
    """Best sustained sentences/s over HTTP against CTranslate2's offline greedy rate (same compute type and
    threads; the goal is ≥ 0.8×; and against its fastest thread count when that is another: on 2 cores it has run
    3× slower with 2 threads than with 1) and against the FastAPI + transformers service (the goal is ≥ 5×).

    ``anchors``: CTranslate2's rate run just before and just after a server's sweep, which the ratio then uses (this
    machine's speed has moved by 40 % within an hour, longer than a whole run takes); else the offline table's."""
    ct2 = {(r.job.compute, r.job.threads): n / r.median_seconds for r in offline
           if r.job.engine == "ctranslate2" and r.job.beam == 1}  # fmt: skip
    fastest = {compute: max((rate, threads) for (c, threads), rate in ct2.items() if c == compute)
               for compute in {c for c, _ in ct2}}  # fmt: skip
    lines = []
    for (name, threads), (points, _) in curves.items():
        best = best_sustained(points)
        if not name.startswith("attnserve") or best is None:
            continue
        compute = "int8" if name.endswith("int8") else "float32"
        parts = []
        if anchors and (name, threads) in anchors:
            before, after = anchors[name, threads]
            parts.append(f"{best.achieved / ((before + after) / 2):.2f}× CTranslate2 {compute} offline, run just "
                         f"before and after the sweep ({before:,.1f} and {after:,.1f} sentences/s)")  # fmt: skip
        elif (compute, threads) in ct2:
            parts.append(f"{best.achieved / ct2[compute, threads]:.2f}× CTranslate2 {compute} offline")
        if compute in fastest and fastest[compute][1] != threads:
            rate, at = fastest[compute]
            parts.append(f"{best.achieved / rate:.2f}× its fastest in the offline table ({at} thread(s))")
        peer = best_sustained(curves.get(("FastAPI + transformers", threads), ([], None))[0])
        parts.append(f"{best.achieved / peer.achieved:.1f}× FastAPI + transformers" if peer else "the transformers "
                     "service sustained no rate with p99 ≤ 1 s")  # fmt: skip
        lines.append(f"- {name}, {threads} thread(s): " + "; ".join(parts))
    return "Best sustained rate (p99 ≤ 1 s) against the peers:\n\n" + "\n".join(lines)


def plot_curves(curves: dict[tuple[str, int], tuple[list[LoadPoint], float | None]], out: Path) -> list[Path]:
    """One PNG per thread count: p50 and p99 latency against offered load, both servers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    files = []
    for threads in sorted({t for _, t in curves}):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        servers = [(name, points) for (name, t), (points, _) in curves.items() if t == threads and points]
        for color, (name, points) in enumerate(servers):
            x = [p.offered for p in points]
            for q, style in (("p50", "--"), ("p99", "-")):
                y = [min(getattr(p, q), 1e3) for p in points]  # failures (∞) drawn at 1000 s
                ax.plot(x, y, style, color=f"C{color}", marker="o", label=f"{name} {q}")
        ax.axhline(SLO_S, color="grey", linewidth=0.8, linestyle=":", label="p99 objective (1 s)")
        ax.set(xscale="log", yscale="log", xlabel="offered load (sentences/s)", ylabel="latency (s)")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"Open-loop latency, {threads} thread{'s' if threads > 1 else ''}")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        path = out / f"peers-latency-threads{threads}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


def mixed_table(results: dict[str, dict[str, LoadPoint]], supported: bool, rate: float, threads: int) -> str:
    rows = []
    for setting, by_label in results.items():
        name = "continuous batching" if setting == "true" else "request-level batching"
        s, lg = by_label["short"], by_label["long"]
        rows.append(
            f"| {name} | {fmt_ms(s.p50)} | **{fmt_ms(s.p99)}** | {fmt_ms(lg.p50)} | {fmt_ms(lg.p99)} | "
            f"{by_label['all'].achieved:.1f} | {s.errors + lg.errors}/{s.n + lg.n} |"
        )
    note = (
        "\n\nThe service reads `ATTNSERVE_CONTINUOUS_BATCHING` (service.settings): the runs differ in it."
        if supported
        else "\n\n**The service has no `ATTNSERVE_CONTINUOUS_BATCHING` switch yet: both runs used continuous batching "
        "and differ only by noise.**"
    )
    return (
        f"{rate:g} requests/s offered for the run, {threads} thread(s), 10 % long (the longest tenth of the "
        "sentences, long `max_length`) and 90 % short (the shorter half), the same arrivals for both settings "
        "(`ATTNSERVE_CONTINUOUS_BATCHING=true|false`).\n\n"
        "| attnserve | short p50 ms | short p99 ms | long p50 ms | long p99 ms | achieved/s | errors |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + note
    )


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV: source, reference (default: the test split)")
    ap.add_argument("--sentences", type=int, default=1000, help="test sentences (a deterministic sample)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts to run, e.g. 1 2")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions of each offline run (median)")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes (1 = greedy)")
    ap.add_argument("--max-length", type=int, default=None, help="offline max_length (default: 256 or the model's)")
    ap.add_argument("--rates", type=float, nargs="+", default=[2, 4, 8, 16, 32, 64, 128], help="offered loads/s")
    ap.add_argument("--load-seconds", type=float, default=30, help="seconds of arrivals per offered load")
    ap.add_argument("--stop-p99", type=float, default=5.0, help="stop raising the load past this p99 (s)")
    ap.add_argument("--refine", type=int, default=2, help="rates bisected below the first that broke p99 ≤ 1 s")
    ap.add_argument("--request-timeout", type=float, default=60, help="client timeout per request (s)")
    ap.add_argument("--mixed-rate", type=float, default=None, help="mixed load's rate (default: ½ best sustained)")
    ap.add_argument("--parts", nargs="+", choices=["offline", "http", "mixed"], default=["offline", "http", "mixed"])
    ap.add_argument("--engine-timeout", type=float, default=3600, help="seconds for one offline run")
    ap.add_argument("--work", type=Path, default=None, help="keep conversions here (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md and the plots go here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="write into a new temporary directory instead of --out")
    # Modes used by the run itself.
    ap.add_argument("--engine", choices=["ctranslate2", "transformers", "attnserve"], help=argparse.SUPPRESS)
    ap.add_argument("--compute", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--serve-transformers", type=Path, metavar="DIR", help="serve a MarianMTModel directory (peer 5)")
    ap.add_argument("--port", type=int, default=8001, help="port for --serve-transformers")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.engine:
        assert args.work is not None, "--engine needs --work"
        engine_main(args)
        return
    if args.serve_transformers:
        serve_transformers(args.serve_transformers, args.port, args.threads[0])
        return

    from service.bundle import load_bundle

    if {"http", "mixed"} & set(args.parts):
        import aiohttp  # noqa: F401  (the load generator and the plots: fail now, not after the runs)
        import matplotlib  # noqa: F401

    bundle = load_bundle(args.bundle)
    spec = bundle.spec
    limit = min(SERVICE_MAX_LENGTH, spec.max_positions)  # the service's max_tokens (413 beyond)
    chosen = [(s, r, bundle.tokenizer.encode_source(s)) for s, r in pairs(args.texts, args.sentences) if s.strip()]
    kept = [(s, r, ids) for s, r, ids in chosen if len(ids) <= limit]
    if not kept:
        sys.exit("peers: no test sentence fits the model's limits")
    sentences, references, sources = [s for s, _, _ in kept], [r for _, r, _ in kept], [ids for _, _, ids in kept]
    max_length = min(args.max_length or SERVICE_MAX_LENGTH, spec.max_positions)
    out = Path(tempfile.mkdtemp(prefix="peers-")) if args.no_write else args.out
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="peers-work-"))
    print(
        f"{len(sentences)} sentences ({len(chosen) - len(kept)} over {limit} tokens dropped), max_length {max_length}"
    )

    sections: list[str] = []
    try:
        prepared = prepare(args.bundle, work)
        setup: dict[str, Any] = {"bundle": str(prepared.bundle), "hf": str(prepared.hf), "ct2": str(prepared.ct2)}
        setup |= {"sources": sources, "max_length": max_length}
        (work / "setup.json").write_text(json.dumps(setup))

        offline_results: list[JobResult] = []
        if "offline" in args.parts:
            jobs = [Job(e, c, b, t) for t in args.threads for b in args.beams for e, c in OFFLINE]
            results = offline_results = run_offline(jobs, work, args.repeats, args.engine_timeout)
            table = offline_table(results, bundle, references, len(sentences))
            identity = identity_report(results, bundle, sentences, args.threads[0])
            print(f"\n{table}\n\n{identity}\n", flush=True)
            sections.append(
                f"### Offline: engines alone, batches of {BATCH} sorted by length\n\n"
                f"Median of {args.repeats} interleaved runs, each in its own process (peak RSS = that process's "
                f"VmHWM, Python and libraries included); load time and one warm-up batch excluded. Target "
                f"tokens exclude `</s>`. × CTranslate2 compares target tokens/s with CTranslate2 at the same compute "
                f"type (int8 with int8, the others with float32), decoding and threads. chrF (sacrebleu) against the "
                f"references.\n\n{table}\n\nSame weights, same tokens? Threads {args.threads[0]}:\n\n{identity}"
            )

        curves: dict[tuple[str, int], tuple[list[LoadPoint], float | None]] = {}
        anchors: dict[tuple[str, int], tuple[float, float]] = {}  # CTranslate2's rate around each sweep
        pair = {"source": bundle.source_lang, "target": bundle.target_lang}
        bodies = [{"q": s, **pair} for s in sentences]
        if "http" in args.parts:
            for threads in args.threads:
                # n threads: n decoding threads of one ONNX Runtime thread each (service/settings.py says why)
                env = {"ATTNSERVE_DECODE_THREADS": str(threads), "ATTNSERVE_THREADS": "1", "OMP_NUM_THREADS": "1"}
                int8 = {**env, "ATTNSERVE_GRAPH_VARIANT": "int8"}
                starters: list[tuple[str, Callable[[], Server]]] = [
                    ("attnserve", partial(attnserve_server, bundle.path, env)),
                    ("attnserve int8", partial(attnserve_server, prepared.bundle, int8)),
                    ("FastAPI + transformers", partial(transformers_server, prepared.hf, threads)),
                ]
                for name, start in starters:  # one server at a time: each gets the machine to itself
                    anchor = Job("ctranslate2", "int8" if name.endswith("int8") else "float32", 1, threads)
                    before = (
                        anchor_rate(anchor, work, len(sentences), args.engine_timeout)
                        if name.startswith("attnserve")
                        else None
                    )
                    with start() as server:
                        points = sweep(
                            server, bodies, args.rates, args.load_seconds, args.stop_p99, args.request_timeout,
                            args.refine,
                        )  # fmt: skip
                        curves[(name, threads)] = (points, server.peak_rss_mb())
                    if before is not None:
                        anchors[(name, threads)] = (
                            before,
                            anchor_rate(anchor, work, len(sentences), args.engine_timeout),
                        )
                    print(
                        f"{name}, {threads} thread(s): "
                        + ", ".join(f"{p.offered:g}/s p99 {fmt_ms(p.p99)} ms" for p in points),
                        flush=True,
                    )
            tables = http_tables(curves) + "\n\n" + http_ratios(curves, offline_results, len(sentences), anchors)
            plots = plot_curves(curves, out)
            print(f"\n{tables}\n", flush=True)
            images = "\n".join(f"![latency against offered load]({p.name})" for p in plots)
            sections.append(
                f"### Over HTTP: open-loop Poisson load\n\nOffered loads {', '.join(f'{r:g}' for r in args.rates)} "
                f"sentences/s, then {args.refine} more bisecting between the best rate with p99 ≤ 1 s and the next, "
                f"{args.load_seconds:g} s each, one sentence per request drawn from the same sentences, "
                f"greedy, attnserve's default `max_length` (min(256, 2 × source + 10)) on both servers; latency from "
                f"each request's scheduled send time (no coordinated omission); attnserve at n threads runs n "
                f"decoding threads of one ONNX Runtime thread each (`ATTNSERVE_DECODE_THREADS=n`); a rate with errors "
                f"or p99 over "
                f"{args.stop_p99:g} s ends the sweep. The load generator runs on the same machine. One offline "
                f"CTranslate2 run (greedy, the same compute type and threads) just before and one just after each "
                f"attnserve sweep anchor its ratio: their mean is the rate it is compared with. The transformers "
                f"service is a plain FastAPI app (`python bench/peers.py --serve-transformers DIR`) that answers one "
                f"request at a time.\n\n{tables}\n\n{images}"
            )

        if "mixed" in args.parts:
            threads = args.threads[0]
            rate = args.mixed_rate
            if rate is None:
                best = best_sustained(curves.get(("attnserve", threads), ([], None))[0])
                rate = round(best.achieved / 2, 1) if best else min(args.rates)
            supported = continuous_batching_switch()
            lengths = [len(s) for s in sources]
            mixed = mixed_load(
                bundle, sentences, lengths, rate, args.load_seconds, threads, max_length, args.request_timeout
            )
            table = mixed_table(mixed, supported, rate, threads)
            print(f"\n{table}\n", flush=True)
            sections.append(f"### Mixed load: continuous against request-level batching\n\n{table}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    command = "python bench/peers.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    source = args.texts if args.texts.exists() else "built-in list"
    body = (
        "## Peers: CTranslate2, transformers, attnserve (bench/peers.py)\n\n"
        f"`{command}`\n\n"
        f"Machine: {machine()}. {versions('onnxruntime', 'ctranslate2', 'torch', 'transformers')}.\n\n"
        f"Bundle `{shown(args.bundle)}` ({bundle.name}); {len(sentences)} sentences from {source} "
        f"(deterministic sample, {len(chosen) - len(kept)} over {limit} tokens dropped); every engine gets the same "
        f"token ids; offline `max_length` {max_length}.\n\n" + "\n\n".join(sections)
    )
    write_section("peers", body, out / "BENCHMARKS.md")
    print(f"wrote {out / 'BENCHMARKS.md'}")


if __name__ == "__main__":
    main()
