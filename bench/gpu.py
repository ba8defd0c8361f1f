"""The peers on one NVIDIA GPU, and whether the GPU answers as the CPU does.

1. Check: attnserve's runner on ONNX Runtime's CUDA execution provider against the same runner on the CPU, float32,
   greedy: the fraction of identical tokens, and for identical outputs the largest difference of the cross-attention
   (and encoder attention) weights, collected by ``decode(..., attention=True)``; it passes at 100 % and ≤ 1e-3.
   The device decoder (the new runner, /translate's on CUDA) against the exact graphs on the CPU: identical tokens,
   greedy and beam 4.
2. Throughput, batch sizes 1 to 256 (sorted by length), greedy and beam 4, interleaved repetitions (median):
   attnserve's runners (``--runners``: ``old``, the exact graphs through IOBinding, and ``new``, the device decoder;
   float32, and float16, which ``model.export.add_float16`` adds to a copy of a bundle without it), CTranslate2 on
   CUDA (float32, float16, int8_float16) and transformers ``generate`` on CUDA (float32, float16), on the same weights
   (bench/peers.py's conversions) and the same token ids.
3. ``--breakdown``: each runner's decoding step split into decoder run, copies, selection, reorder and the rest
   (bench/step_times.py), at ``--breakdown-batches``, greedy and beam 4, float32 and float16.
4. ``--cuda-graph``: ONNX Runtime's verdict on the device decoder with ``enable_cuda_graph``, and one batch-1 step's
   latency with and without it (bench/step_times.py).

``--smoke`` runs all of it on ONNX Runtime's CPU execution provider standing in for CUDA (attnserve only, a few
sentences, small batches): the code paths, not figures.

On CUDA the runner binds its inputs and outputs (IOBinding): the key/value caches stay on the GPU from one step to
the next, and only token ids, masks, logits and attention rows cross to the host. ONNX Runtime's CUDA execution
provider may compute float32 MatMuls in TF32 on Ampere and newer GPUs (its ``use_tf32`` option, on by default, which
the runner does not set): if the check fails on attention weights alone, that is the first suspect.

Needs onnxruntime-gpu (instead of onnxruntime, see README "GPU") and a CUDA GPU; without a CUDA execution provider it
stops at once with "no CUDA execution provider". CTranslate2 and transformers rows need their CUDA builds (skipped,
with a note, otherwise). Writes its section of docs/BENCHMARKS.md, docs/gpu-throughput.png and the raw figures,
bench/results/gpu.json.

    python bench/gpu.py --bundle model/bundles/en-ja --breakdown --cuda-graph
    python bench/gpu.py --sentences 200 --batch-sizes 1 32 256 --repeats 1 --no-write   # a short check
    python bench/gpu.py --smoke --no-write   # the CPU stands in (--provider cpu): a dry run of every code path

bench/gpu_device.sh runs it on a lent GPU machine, with the service over HTTP and ONNX Runtime's profile.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from common import CORPUS, DOCS, ROOT, cpu_model, pairs, versions, write_section
from step_times import StepTimes, cuda_graph_trial, measure
from step_times import table as step_table

CUDA = "CUDAExecutionProvider"
# --provider: cuda, or cpu, where the CPU stands in for the GPU (--smoke, bench/gpu_device.sh --smoke)
Device = Literal["cuda", "cpu"]
PROVIDERS = {"cuda": CUDA, "cpu": "CPUExecutionProvider"}
RESULTS = ROOT / "bench" / "results" / "gpu.json"
ATTENTION_TOLERANCE = 1e-3
TOKENS_IDENTICAL = 0.99  # share of sentences whose tokens must be the CPU's, greedy and beam 4
FLOAT16_CHRF_TOLERANCE = 0.5


def require_cuda() -> None:
    """Stop with a clear message when ONNX Runtime has no CUDA execution provider."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if CUDA not in available:
        sys.exit(
            f"gpu: no CUDA execution provider: ONNX Runtime offers only {available}. Install onnxruntime-gpu "
            "(instead of onnxruntime: pip uninstall -y onnxruntime && pip install onnxruntime-gpu) on a machine "
            "with an NVIDIA GPU and its driver."
        )


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "an NVIDIA GPU (nvidia-smi did not answer)"


# ---------------------------------------------------------------------------------------------------------------
# The check: GPU = CPU.


@dataclass
class Check:
    n: int = 0
    identical: int = 0
    max_cross: float = 0.0  # largest |GPU - CPU| of cross-attention weights over identical outputs
    max_encoder: float = 0.0
    beam_identical: int = 0  # beam 4, tokens only
    device_identical: int | None = None  # the device decoder on the GPU against the exact graphs on the CPU, greedy
    device_beam_identical: int | None = None  # and beam 4; None: the bundle has no device decoder
    examples: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        device = [x for x in (self.device_identical, self.device_beam_identical) if x is not None]
        identical = min(self.identical, self.beam_identical, *device) >= TOKENS_IDENTICAL * self.n
        return identical and max(self.max_cross, self.max_encoder) <= ATTENTION_TOLERANCE


def check_gpu_equals_cpu(
    bundle_dir: Path, sources: list[list[int]], max_length: int, batch: int = 32, provider: Device = "cuda"
) -> Check:
    """Greedy float32 on the CPU and on ``provider``, attention collected; compares tokens and weights per sentence;
    and the device decoder's tokens on ``provider`` with the CPU's, greedy and beam 4, where the bundle has one."""
    from engines import length_batches

    from service.decoding import DecodeRequest, decode
    from service.runtime.bundle import load_bundle
    from service.runtime.runner import open_runner

    bundle = load_bundle(bundle_dir, verify=False)
    cpu, gpu = open_runner(bundle, "cpu", 1), open_runner(bundle, provider, 1, io_binding=True)
    if gpu.provider != PROVIDERS[provider]:
        sys.exit(f"gpu: the runner chose {gpu.provider}, not {PROVIDERS[provider]}")
    new = None
    if bundle.has_graph("device_decoder"):
        new = open_runner(bundle, provider, 1, role="device_decoder")
    check = Check(n=len(sources), device_identical=0 if new else None, device_beam_identical=0 if new else None)
    for idx in length_batches([len(s) for s in sources], batch):
        requests = [DecodeRequest(src=sources[i], max_length=max_length, attention=True) for i in idx]
        for i, a, b in zip(idx, decode(cpu, requests), decode(gpu, requests), strict=True):
            ha, hb = a.hypotheses[0], b.hypotheses[0]
            if ha.tokens != hb.tokens:
                if len(check.examples) < 3:
                    at = next((k for k, (p, q) in enumerate(zip(ha.tokens, hb.tokens, strict=False)) if p != q), 0)
                    check.examples.append(f"sentence {i}: first difference at token {at}")
                continue
            check.identical += 1
            cross = np.abs(np.stack(ha.cross_attention) - np.stack(hb.cross_attention)).max()
            check.max_cross = max(check.max_cross, float(cross))
            if a.encoder_attention is not None and b.encoder_attention is not None:
                enc = np.abs(a.encoder_attention - b.encoder_attention).max()
                check.max_encoder = max(check.max_encoder, float(enc))
        beams = [DecodeRequest(src=sources[i], beam_size=4, max_length=max_length) for i in idx]
        on_cpu = decode(cpu, beams)
        for a, b in zip(on_cpu, decode(gpu, beams), strict=True):
            check.beam_identical += a.hypotheses[0].tokens == b.hypotheses[0].tokens
        if new is not None and check.device_identical is not None and check.device_beam_identical is not None:
            greedy = [DecodeRequest(src=sources[i], max_length=max_length) for i in idx]
            for a, b in zip(decode(cpu, greedy), decode(new, greedy), strict=True):
                check.device_identical += a.hypotheses[0].tokens == b.hypotheses[0].tokens
            for a, b in zip(on_cpu, decode(new, beams), strict=True):
                check.device_beam_identical += a.hypotheses[0].tokens == b.hypotheses[0].tokens
    return check


def float16_chrf(
    engines: dict[tuple[str, str], Any], sources: list[list[int]], references: list[str], max_length: int
) -> dict[str, Any]:
    """chrF against the references of attnserve's greedy float32 and float16 on CUDA (the runner /translate uses);
    empty without references or without both engines."""
    import sacrebleu
    from engines import translate

    variants = ("float32", "float16")
    key = "attnserve-device" if all(("attnserve-device", v) in engines for v in variants) else "attnserve"
    if not all(references) or any((key, v) not in engines for v in variants):
        return {}
    scores = {}
    for variant in variants:
        engine = engines[(key, variant)]
        outputs = [engine.bundle.tokenizer.decode(t) for t in translate(engine, sources, 1, max_length)]
        scores[variant] = sacrebleu.corpus_chrf(outputs, [references]).score
    return scores


# ---------------------------------------------------------------------------------------------------------------
# Throughput.


@dataclass
class Row:
    engine: str  # label, e.g. "attnserve runner (CUDA EP, IOBinding)"
    key: str  # "attnserve", "ctranslate2", "transformers"
    compute: str
    beam: int
    batch: int
    seconds: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None

    @property
    def rate(self) -> float | None:
        """Target tokens/s over the median run; None when the row failed or never ran."""
        return self.tokens / statistics.median(self.seconds) if self.seconds and self.error is None else None


RUNNERS = {"old": "attnserve", "new": "attnserve-device"}  # --runners: the rows' keys


def load_engines(
    prepared: Any, bundle_variants: list[str], wanted: Sequence[str], runners: Sequence[str] = ("old", "new"),
    provider: Device = "cuda",
) -> tuple[dict[tuple[str, str], Any], list[str]]:  # fmt: skip
    """Every engine and compute type that this machine can run on ``provider``; notes for the ones it cannot.
    attnserve's ``runners``: ``old`` (the exact graphs through IOBinding), ``new`` (the device decoder)."""
    from engines import AttnserveEngine, CTranslate2Engine, TransformersEngine

    from service.runtime.bundle import load_bundle

    engines: dict[tuple[str, str], Any] = {}
    notes: list[str] = []
    bundle = load_bundle(prepared.bundle, verify=False)
    for runner in runners if "attnserve" in wanted else ():
        new = runner == "new"
        for variant in ("float32", "float16"):
            if variant not in bundle_variants or (new and not bundle.has_graph("device_decoder", variant)):
                notes.append(f"attnserve {runner} runner {variant}: the bundle has no such graphs (skipped)")
                continue
            try:
                engines[(RUNNERS[runner], variant)] = AttnserveEngine(
                    prepared.bundle, variant, 1, provider=provider, io_binding=True, device_decoder=new
                )
            except Exception as e:  # a variant the runner cannot drive yet is a result, not a crash
                notes.append(f"attnserve {runner} runner {variant}: could not load ({type(e).__name__}: {e})")
    if "ctranslate2" in wanted:
        import ctranslate2

        if ctranslate2.get_cuda_device_count() == 0:
            notes.append("CTranslate2: this build sees no CUDA device (skipped)")
        else:
            for compute in ("float32", "float16", "int8_float16"):
                engines[("ctranslate2", compute)] = CTranslate2Engine(
                    prepared.ct2, prepared.vocab, compute, threads=1, device="cuda"
                )
    if "transformers" in wanted:
        import torch

        if not torch.cuda.is_available():
            notes.append("transformers: this torch build has no CUDA (skipped)")
        else:
            for dtype in ("float32", "float16"):
                engines[("transformers", dtype)] = TransformersEngine(prepared.hf, device="cuda", dtype=dtype)
    return engines, notes


LABELS = {
    "attnserve": "attnserve runner (CUDA EP, IOBinding)",  # the old runner: the exact graphs
    "attnserve-device": "attnserve device decoder (CUDA EP)",  # the new runner
    "ctranslate2": "CTranslate2 (cuda)",
    "transformers": "transformers (cuda)",
}


def label(key: str, provider: Device) -> str:
    """A row's engine as the table names it (the CPU's execution provider with --provider cpu)."""
    return LABELS[key] if provider == "cuda" else LABELS[key].replace("CUDA EP", "CPU EP")


def run_throughput(
    engines: dict[tuple[str, str], Any],
    sources: list[list[int]],
    beams: Sequence[int],
    batches: Sequence[int],
    max_length: int,
    repeats: int,
    provider: Device = "cuda",
) -> list[Row]:
    """Every (engine, compute, beam, batch) ``repeats`` times, interleaved, after one untimed batch of each."""
    from engines import translate
    from tqdm import tqdm

    broken: dict[tuple[str, str], str] = {}
    for key, engine in engines.items():  # every measured shape once, untimed: kernels chosen, buffers sized
        for beam in beams:
            for batch in batches:
                try:
                    translate(engine, sources[:batch], beam, max_length, batch_size=batch)
                except Exception as e:  # e.g. a CTranslate2 build for another CUDA major: its rows say why
                    broken.setdefault(key, f"{type(e).__name__}: {str(e)[:120]}")
    rows = [
        Row(label(k, provider), k, c, beam, b, error=broken.get((k, c)))
        for beam in beams
        for b in batches
        for (k, c) in engines
    ]
    with tqdm(total=repeats * len(rows), desc="gpu", unit="run") as bar:
        for _ in range(repeats):
            for row in rows:
                bar.set_postfix_str(f"{row.key} {row.compute} beam {row.beam} batch {row.batch}")
                if row.error is None:
                    try:
                        t0 = time.perf_counter()
                        out = translate(engines[(row.key, row.compute)], sources, row.beam, max_length, row.batch)
                        row.seconds.append(time.perf_counter() - t0)
                        row.tokens = sum(len(t) for t in out)
                    except Exception as e:  # e.g. out of memory at batch 256 × beam 4: recorded, the rest goes on
                        row.error = f"{type(e).__name__}: {str(e)[:120]}"
                bar.update()
    return rows


def table(rows: list[Row], n: int) -> str:
    """Every row's rate, against CTranslate2 in the same compute type and against PyTorch (transformers) float16,
    at the same decoding and batch size."""

    ct2 = {(r.compute, r.beam, r.batch): r.rate for r in rows if r.key == "ctranslate2"}
    torch16 = {(r.beam, r.batch): r.rate for r in rows if (r.key, r.compute) == ("transformers", "float16")}
    lines = [
        "| engine | compute | decoding | batch | target tokens/s | sentences/s | × CTranslate2 | × PyTorch float16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        decoding = "greedy" if r.beam == 1 else f"beam {r.beam}"
        value = r.rate
        if value is None:
            lines.append(f"| {r.engine} | {r.compute} | {decoding} | {r.batch} | failed: {r.error} | — | — | — |")
            continue
        ratios = (ct2.get((r.compute, r.beam, r.batch)), torch16.get((r.beam, r.batch)))
        x_ct2, x_torch = (f"{value / ref:.2f}" if ref else "—" for ref in ratios)
        sps = n / statistics.median(r.seconds)
        lines.append(
            f"| {r.engine} | {r.compute} | {decoding} | {r.batch} | {value:,.0f} | {sps:.1f} | {x_ct2} | {x_torch} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    beams = sorted({r.beam for r in rows})
    fig, axes = plt.subplots(1, len(beams), figsize=(6 * len(beams), 4.5), squeeze=False)
    for ax, beam in zip(axes[0], beams, strict=True):
        for engine, compute in sorted({(r.engine, r.compute) for r in rows}):
            points = [
                (r.batch, r.rate)
                for r in rows
                if (r.engine, r.compute, r.beam) == (engine, compute, beam) and r.rate is not None
            ]
            if points:
                ax.plot(*zip(*sorted(points), strict=True), marker="o", label=f"{engine} {compute}")
        ax.set(xscale="log", yscale="log", xlabel="batch size (sentences)", ylabel="target tokens/s")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_title("greedy" if beam == 1 else f"beam {beam}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    path = out / "gpu-throughput.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV whose first column is the source text")
    ap.add_argument("--sentences", type=int, default=1000, help="test sentences (a deterministic sample)")
    ap.add_argument("--check-sentences", type=int, default=100, help="sentences for the GPU = CPU check")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes (1 = greedy)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (median)")
    ap.add_argument("--max-length", type=int, default=None, help="max_length (default: 256 or the model's)")
    ap.add_argument(
        "--engines",
        nargs="+",
        choices=["attnserve", "ctranslate2", "transformers"],
        default=["attnserve", "ctranslate2", "transformers"],
    )
    ap.add_argument("--work", type=Path, default=None, help="keep conversions here (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md and the plot go here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="write into a new temporary directory instead of --out")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the raw results as JSON (default %(default)s)")
    ap.add_argument("--runners", nargs="+", choices=list(RUNNERS), default=list(RUNNERS),
                    help="attnserve runners: old (the exact graphs, IOBinding), new (the device decoder)")  # fmt: skip
    ap.add_argument("--breakdown", action="store_true", help="each runner's step split by where its time goes")
    ap.add_argument("--breakdown-batches", type=int, nargs="+", default=[1, 32, 128], help="its batch sizes")
    ap.add_argument("--breakdown-sentences", type=int, default=64, help="its sentences (the first of the sample)")
    ap.add_argument("--cuda-graph", action="store_true", help="try the device decoder with enable_cuda_graph")
    ap.add_argument(
        "--provider", choices=sorted(PROVIDERS), default="cuda", help="cpu: the CPU stands in for the GPU (a dry run)"
    )
    ap.add_argument("--smoke", action="store_true",
                    help="--provider cpu: attnserve only, 8 sentences, batches 1 and 4, max_length 10, "
                         "breakdown and CUDA-graph trial included; written to a temporary directory unless --out "
                         "and --results are given")  # fmt: skip
    args = ap.parse_args(argv)
    if args.smoke:
        args.engines, args.sentences, args.check_sentences = ["attnserve"], 8, 8
        args.batch_sizes, args.breakdown_batches, args.repeats, args.max_length = [1, 4], [1, 4], 1, 10
        args.breakdown = args.cuda_graph = True
        args.provider = "cpu"
        if args.out == DOCS:
            args.no_write = True
        if args.results == RESULTS:
            args.results = Path(tempfile.mkdtemp(prefix="gpu-smoke-")) / "gpu.json"
    return args


def raw_results(
    check: Check, rows: list[Row], notes: list[str], n: int, max_length: int, provider: str = CUDA
) -> dict[str, Any]:
    """Everything the run measured, for bench/results/gpu.json: the device, the provider, versions, the check and
    every (engine, compute, decoding, batch) with its times."""
    import onnxruntime as ort

    return {
        "device": gpu_name() if provider == CUDA else f"the CPU standing in (--smoke): {cpu_model()}",
        "host_cpu": cpu_model(),
        "providers": ort.get_available_providers(),
        "provider": provider,
        "versions": versions("onnxruntime-gpu", "onnxruntime", "ctranslate2", "torch", "transformers"),
        "sentences": n,
        "max_length": max_length,
        "check": {
            "n": check.n,
            "identical": check.identical,
            "beam_identical": check.beam_identical,
            "device_decoder_identical": check.device_identical,
            "device_decoder_beam_identical": check.device_beam_identical,
            "max_cross_attention_difference": check.max_cross,
            "max_encoder_attention_difference": check.max_encoder,
            "tolerance": ATTENTION_TOLERANCE,
            "passed": check.passed,
            "examples": check.examples,
        },
        "rows": [
            {
                "engine": r.engine,
                "key": r.key,
                "compute": r.compute,
                "beam": r.beam,
                "batch": r.batch,
                "seconds": r.seconds,
                "target_tokens": r.tokens,
                "target_tokens_per_s": r.rate,
                "error": r.error,
            }
            for r in rows
        ],
        "notes": notes,
    }


def breakdown(
    bundle_dir: Path, sources: list[list[int]], args: argparse.Namespace, provider: Device
) -> list[StepTimes]:
    """Each runner's per-step time split (bench/step_times.py), float32 and float16 (where the bundle has its
    graphs), greedy and beam 4, at ``--breakdown-batches``."""
    from service.runtime.bundle import load_bundle
    from service.runtime.runner import open_runner

    bundle = load_bundle(bundle_dir, verify=False)
    rows = []
    for variant in (v for v in ("float32", "float16") if v in bundle.variants):
        for name in args.runners:
            new = name == "new"
            if new and not bundle.has_graph("device_decoder", variant):
                continue
            runner = open_runner(bundle, provider, 1, variant, "device_decoder" if new else "decoder", io_binding=True)
            for beam in (1, 4):
                for batch in args.breakdown_batches:
                    rows.append(measure(runner, name, variant, sources, beam, batch, args.max_length))
    return rows


def check_summary(check: Check, provider: Device) -> str:
    """The check's paragraph of the section."""
    on = "CUDA" if provider == "cuda" else "the CPU standing in"
    text = (
        f"**{'PASS' if check.passed else 'FAIL'}**: {check.identical}/{check.n} greedy and {check.beam_identical}/"
        f"{check.n} beam-4 float32 outputs identical on {on} and CPU (goal {TOKENS_IDENTICAL:.0%}); over the greedy "
        f"ones, largest cross-attention difference {check.max_cross:.2e}, encoder attention {check.max_encoder:.2e} "
        f"(tolerance {ATTENTION_TOLERANCE:g})."
    )
    if check.device_identical is not None:
        text += (
            f" The device decoder on {on}: {check.device_identical}/{check.n} greedy and "
            f"{check.device_beam_identical}/{check.n} beam-4 outputs identical to the CPU's exact graphs."
        )
    if check.examples:
        text += " Differences: " + "; ".join(check.examples) + "."
    return text


def cuda_graph_text(trials: dict[str, Any]) -> str:
    """The CUDA-graph trial's paragraph: ONNX Runtime's verdict and the step latency, per variant."""
    lines = []
    for variant, trial in trials.items():
        parts = []
        for key in ("without", "with"):
            result = trial[key]
            ms = f", {result['step_ms_median']:.3f} ms a step" if "step_ms_median" in result else ""
            parts.append(f"{key} `enable_cuda_graph`: {result['verdict']}{ms}")
        lines.append(f"- {variant}, {trial['shape']}: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:  # long: the run's steps in order, each a call
    args = parse_args(argv)
    if args.provider == "cuda":
        require_cuda()

    from engines import SERVICE_MAX_LENGTH, prepare

    from service.runtime.bundle import load_bundle

    bundle = load_bundle(args.bundle)
    limit = min(SERVICE_MAX_LENGTH, bundle.spec.max_positions)
    encoded = [(bundle.tokenizer.encode_source(s), r) for s, r in pairs(args.texts, args.sentences) if s.strip()]
    kept = [(ids, r) for ids, r in encoded if len(ids) <= limit]
    sources, references = [ids for ids, _ in kept], [r or "" for _, r in kept]
    max_length = args.max_length = min(args.max_length or SERVICE_MAX_LENGTH, bundle.spec.max_positions)
    out = Path(tempfile.mkdtemp(prefix="gpu-")) if args.no_write else args.out
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-work-"))
    steps: list[StepTimes] = []
    trials: dict[str, Any] = {}
    rows: list[Row] = []
    notes: list[str] = []
    chrf: dict[str, Any] = {}

    def save() -> None:
        """The results so far into ``--results``, after each stage: a run killed at its time limit keeps them."""
        results = raw_results(check, rows, notes, len(sources), max_length, PROVIDERS[args.provider])
        results |= {"chrf": chrf, "breakdown": [asdict(t) | {"per_step_ms": t.per_step_ms()} for t in steps]}
        results |= {"cuda_graph": trials}
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(results, indent=1) + "\n")

    try:
        check = check_gpu_equals_cpu(args.bundle, sources[: args.check_sentences], max_length, provider=args.provider)
        check_text = check_summary(check, args.provider)
        print(check_text, flush=True)
        save()

        prepared = prepare(args.bundle, work, variants=("float16",), with_ctranslate2="ctranslate2" in args.engines)
        prepared_bundle = load_bundle(prepared.bundle, verify=False)
        variants = prepared_bundle.variants
        engines, notes = load_engines(prepared, variants, args.engines, args.runners, args.provider)
        chrf = float16_chrf(engines, sources, references, max_length)
        if chrf:
            gap = chrf["float32"] - chrf["float16"]
            check_text += (
                f" chrF of {len(sources)} greedy translations against their references: float32 "
                f"{chrf['float32']:.2f}, float16 {chrf['float16']:.2f} (goal: within {FLOAT16_CHRF_TOLERANCE:g}; "
                f"{'met' if abs(gap) <= FLOAT16_CHRF_TOLERANCE else 'not met'})."
            )
        save()
        rows = run_throughput(engines, sources, args.beams, args.batch_sizes, max_length, args.repeats, args.provider)
        save()
        if args.breakdown:
            steps = breakdown(prepared.bundle, sources[: args.breakdown_sentences], args, args.provider)
            save()
        if args.cuda_graph:  # last: a capture that fails cannot spoil the rows before it
            trials = {v: cuda_graph_trial(prepared_bundle, v, PROVIDERS[args.provider]) for v in variants
                      if prepared_bundle.has_graph("device_decoder", v)}  # fmt: skip
            save()
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    result = table(rows, len(sources))
    image = plot(rows, out) if importlib.util.find_spec("matplotlib") and not args.smoke else None  # the bench extra's
    print(f"\n{result}\n" + "".join(f"\n- {n}" for n in notes), flush=True)
    extra = ""
    if steps:
        extra += (
            "\n\n### Where a step's time goes (bench/step_times.py)\n\n"
            f"The first {min(len(sources), args.breakdown_sentences)} sentences, milliseconds a decoding step (all of "
            "a batch's rows), by the old runner (the exact graphs through IOBinding) and the new one (the device "
            "decoder).\n\n" + step_table(steps)
        )
        print(step_table(steps), flush=True)
    if trials:
        extra += "\n\n### CUDA graphs\n\n" + cuda_graph_text(trials)
        print(cuda_graph_text(trials), flush=True)
    command = "python bench/gpu.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    machine = f"GPU: {gpu_name()}" if args.provider == "cuda" else "The CPU standing in for a GPU (code paths only)"
    body = (
        "## GPU (bench/gpu.py)\n\n"
        f"`{command}`\n\n"
        f"{machine}; host CPU {cpu_model()}. "
        f"{versions('onnxruntime-gpu', 'onnxruntime', 'ctranslate2', 'torch', 'transformers')}.\n\n"
        f"{len(sources)} sentences (deterministic sample of the test split), the same token ids for every engine, "
        f"`max_length` {max_length}, batches sorted by length, median of {args.repeats} interleaved runs, one "
        "warm-up batch of each shape. attnserve's old runner runs the exact graphs and keeps its key/value caches on "
        "the GPU (IOBinding); the new one runs the device decoder (reordering and token choice inside the step).\n\n"
        f"### GPU = CPU\n\n{check_text}\n\n### Throughput\n\n{result}\n\n"
        + "".join(f"- {n}\n" for n in notes)
        + (f"\n![throughput against batch size]({image.name})" if image else "")
        + extra
        + "\n"
    )
    write_section("gpu", body, out / "BENCHMARKS.md")
    print(f"wrote {out / 'BENCHMARKS.md'}")
    return 0 if check.passed else 1


if __name__ == "__main__":
    sys.exit(main())
