"""attnserve beside its peers, in one run, on the same weights, sentences, decoding and threads.

Offline (no HTTP), each run in its own subprocess (``--engine``, so that its peak RSS is its own), repetitions
interleaved (A, B, C, A, B, C, ...) and the median reported, all in batches of 32 sentences sorted by length, greedy
and beam 4, with one ``max_length`` for every engine:

1. CTranslate2 ``Translator.translate_batch``, float32 and int8 (``compute_type`` at load time), on the bundle's
   weights: ``model.importers.marian.export_marian`` writes a MarianMTModel directory, ``TransformersConverter``
   converts it;
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
import json
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import (
    CORPUS,
    DOCS,
    ROOT,
    Server,
    attnserve_server,
    pairs,
    write_section,
)
from engines import SERVICE_MAX_LENGTH, Prepared, prepare
from load import Curves, best_sustained, continuous_batching_switch, mixed_load, sweep
from offline import OFFLINE, Job, JobResult, anchor_rate, engine_main, run_offline
from report import (
    fmt_ms,
    http_ratios,
    http_section,
    http_tables,
    identity_report,
    mixed_section,
    mixed_table,
    offline_section,
    offline_table,
    peers_section,
    plot_curves,
    shown,
)
from transformers_service import serve_transformers, transformers_server

if TYPE_CHECKING:
    from service.runtime.bundle import Bundle


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


@dataclass(frozen=True)
class Texts:
    """The test sentences that fit the model's limits, their references and token ids."""

    sentences: list[str]
    references: list[str | None]
    sources: list[list[int]]
    dropped: int  # sentences over ``limit`` tokens
    limit: int  # the service's max_tokens (413 beyond)
    max_length: int  # every engine's offline max_length


def load_texts(args: argparse.Namespace, bundle: Bundle) -> Texts:
    """``--sentences`` of ``--texts``, those over the service's token limit dropped; exits when none is left."""
    spec = bundle.spec
    limit = min(SERVICE_MAX_LENGTH, spec.max_positions)
    chosen = [(s, r, bundle.tokenizer.encode_source(s)) for s, r in pairs(args.texts, args.sentences) if s.strip()]
    kept = [(s, r, ids) for s, r, ids in chosen if len(ids) <= limit]
    if not kept:
        sys.exit("peers: no test sentence fits the model's limits")
    max_length = min(args.max_length or SERVICE_MAX_LENGTH, spec.max_positions)
    return Texts([s for s, _, _ in kept], [r for _, r, _ in kept], [ids for _, _, ids in kept],
                 len(chosen) - len(kept), limit, max_length)  # fmt: skip


def offline_part(args: argparse.Namespace, bundle: Bundle, texts: Texts, work: Path) -> tuple[str, list[JobResult]]:
    """Every offline job, its table and identity report printed; returns its section and the results."""
    jobs = [Job(e, c, b, t) for t in args.threads for b in args.beams for e, c in OFFLINE]
    results = run_offline(jobs, work, args.repeats, args.engine_timeout)
    table = offline_table(results, bundle, texts.references, len(texts.sentences))
    identity = identity_report(results, bundle, texts.sentences, args.threads[0])
    print(f"\n{table}\n\n{identity}\n", flush=True)
    return offline_section(table, identity, args.repeats, args.threads[0]), results


def sweep_servers(
    args: argparse.Namespace, bundle: Bundle, texts: Texts, prepared: Prepared, work: Path, threads: int
) -> tuple[Curves, dict[tuple[str, int], tuple[float, float]]]:
    """One server at a time (each gets the machine to itself) swept at ``threads``; attnserve's sweeps between two
    CTranslate2 offline runs (:func:`~report.http_ratios`' anchors)."""
    # n threads: n decoding threads of one ONNX Runtime thread each (service/settings.py says why)
    env = {"ATTNSERVE_DECODE_THREADS": str(threads), "ATTNSERVE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    int8 = {**env, "ATTNSERVE_GRAPH_VARIANT": "int8"}
    starters: list[tuple[str, Callable[[], Server]]] = [
        ("attnserve", partial(attnserve_server, bundle.path, env)),
        ("attnserve int8", partial(attnserve_server, prepared.bundle, int8)),
        ("FastAPI + transformers", partial(transformers_server, prepared.hf, threads)),
    ]
    pair = {"source": bundle.source_lang, "target": bundle.target_lang}
    bodies = [{"q": s, **pair} for s in texts.sentences]
    n = len(texts.sentences)
    curves: Curves = {}
    anchors: dict[tuple[str, int], tuple[float, float]] = {}
    for name, start in starters:
        anchor = Job("ctranslate2", "int8" if name.endswith("int8") else "float32", 1, threads)
        before = anchor_rate(anchor, work, n, args.engine_timeout) if name.startswith("attnserve") else None
        with start() as server:
            points = sweep(
                server, bodies, args.rates, args.load_seconds, args.stop_p99, args.request_timeout, args.refine
            )
            curves[(name, threads)] = (points, server.peak_rss_mb())
        if before is not None:
            anchors[(name, threads)] = (before, anchor_rate(anchor, work, n, args.engine_timeout))
        print(f"{name}, {threads} thread(s): " + ", ".join(f"{p.offered:g}/s p99 {fmt_ms(p.p99)} ms" for p in points),
              flush=True)  # fmt: skip
    return curves, anchors


def http_part(
    args: argparse.Namespace,
    bundle: Bundle,
    texts: Texts,
    prepared: Prepared,
    work: Path,
    out: Path,
    offline: list[JobResult],
) -> tuple[str, Curves]:
    """Every server swept at every thread count, the tables printed and the plots written; returns its section and
    the curves."""
    curves: Curves = {}
    anchors: dict[tuple[str, int], tuple[float, float]] = {}  # CTranslate2's rate around each sweep
    for threads in args.threads:
        more_curves, more_anchors = sweep_servers(args, bundle, texts, prepared, work, threads)
        curves |= more_curves
        anchors |= more_anchors
    tables = http_tables(curves) + "\n\n" + http_ratios(curves, offline, len(texts.sentences), anchors)
    plots = plot_curves(curves, out)
    print(f"\n{tables}\n", flush=True)
    return http_section(args.rates, args.refine, args.load_seconds, args.stop_p99, tables, plots), curves


def mixed_part(args: argparse.Namespace, bundle: Bundle, texts: Texts, curves: Curves) -> str:
    """The mixed load at ``--mixed-rate`` (default: half attnserve's best sustained rate), its table printed;
    returns its section."""
    threads = args.threads[0]
    rate = args.mixed_rate
    if rate is None:
        best = best_sustained(curves.get(("attnserve", threads), ([], None))[0])
        rate = round(best.achieved / 2, 1) if best else min(args.rates)
    supported = continuous_batching_switch()
    lengths = [len(s) for s in texts.sources]
    mixed = mixed_load(bundle, texts.sentences, lengths, rate, args.load_seconds, threads, texts.max_length,
                       args.request_timeout)  # fmt: skip
    table = mixed_table(mixed, supported, rate, threads)
    print(f"\n{table}\n", flush=True)
    return mixed_section(table)


def run_parts(args: argparse.Namespace, bundle: Bundle, texts: Texts, work: Path, out: Path) -> list[str]:
    """The ``--parts`` asked for, in order; returns their sections."""
    prepared = prepare(args.bundle, work)
    setup: dict[str, Any] = {"bundle": str(prepared.bundle), "hf": str(prepared.hf), "ct2": str(prepared.ct2)}
    setup |= {"sources": texts.sources, "max_length": texts.max_length}
    (work / "setup.json").write_text(json.dumps(setup))
    sections: list[str] = []
    offline: list[JobResult] = []
    if "offline" in args.parts:
        section, offline = offline_part(args, bundle, texts, work)
        sections.append(section)
    curves: Curves = {}
    if "http" in args.parts:
        section, curves = http_part(args, bundle, texts, prepared, work, out, offline)
        sections.append(section)
    if "mixed" in args.parts:
        sections.append(mixed_part(args, bundle, texts, curves))
    return sections


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.engine:
        assert args.work is not None, "--engine needs --work"
        engine_main(args)
        return
    if args.serve_transformers:
        serve_transformers(args.serve_transformers, args.port, args.threads[0])
        return

    from service.runtime.bundle import load_bundle

    if {"http", "mixed"} & set(args.parts):
        import aiohttp  # noqa: F401  (the load generator and the plots: fail now, not after the runs)
        import matplotlib  # noqa: F401

    bundle = load_bundle(args.bundle)
    texts = load_texts(args, bundle)
    out = Path(tempfile.mkdtemp(prefix="peers-")) if args.no_write else args.out
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="peers-work-"))
    print(f"{len(texts.sentences)} sentences ({texts.dropped} over {texts.limit} tokens dropped), "
          f"max_length {texts.max_length}")  # fmt: skip
    try:
        sections = run_parts(args, bundle, texts, work, out)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    command = "python bench/peers.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    source = args.texts if args.texts.exists() else "built-in list"
    texts_note = (
        f"Bundle `{shown(args.bundle)}` ({bundle.name}); {len(texts.sentences)} sentences from {source} "
        f"(deterministic sample, {texts.dropped} over {texts.limit} tokens dropped); every engine gets the same "
        f"token ids; offline `max_length` {texts.max_length}."
    )
    body = peers_section(command, texts_note, sections)
    write_section("peers", body, out / "BENCHMARKS.md")
    print(f"wrote {out / 'BENCHMARKS.md'}")


if __name__ == "__main__":
    main()
