"""The peers report: its tables, the latency plots and the text of its BENCHMARKS.md section."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from common import (
    ROOT,
    machine,
    versions,
)
from engines import BATCH
from load import SLO_S, Curves, LoadPoint, best_sustained
from offline import NAMES, JobResult

if TYPE_CHECKING:
    from service.runtime.bundle import Bundle


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


def http_tables(curves: Curves) -> str:
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


def http_ratios(
    curves: Curves,
    offline: list[JobResult],
    n: int,
    anchors: dict[tuple[str, int], tuple[float, float]] | None = None,
) -> str:
    """Best sustained sentences/s over HTTP against CTranslate2's offline greedy rate (same compute type and
    threads; and against its fastest thread count when that is another, since more threads need not be faster) and
    against the FastAPI + transformers service.

    ``anchors``: CTranslate2's rate run just before and just after a server's sweep, which the ratio then uses (a
    machine's speed can drift within a run); else the offline table's."""
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


def plot_curves(curves: Curves, out: Path) -> list[Path]:
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


def offline_section(table: str, identity: str, repeats: int, threads: int) -> str:
    """The offline part's BENCHMARKS.md section."""
    return (
        f"### Offline: engines alone, batches of {BATCH} sorted by length\n\n"
        f"Median of {repeats} interleaved runs, each in its own process (peak RSS = that process's "
        f"VmHWM, Python and libraries included); load time and one warm-up batch excluded. Target "
        f"tokens exclude `</s>`. × CTranslate2 compares target tokens/s with CTranslate2 at the same compute "
        f"type (int8 with int8, the others with float32), decoding and threads. chrF (sacrebleu) against the "
        f"references.\n\n{table}\n\nSame weights, same tokens? Threads {threads}:\n\n{identity}"
    )


def http_section(
    rates: Sequence[float], refine: int, load_seconds: float, stop_p99: float, tables: str, plots: list[Path]
) -> str:
    """The HTTP part's BENCHMARKS.md section."""
    images = "\n".join(f"![latency against offered load]({p.name})" for p in plots)
    return (
        f"### Over HTTP: open-loop Poisson load\n\nOffered loads {', '.join(f'{r:g}' for r in rates)} "
        f"sentences/s, then {refine} more bisecting between the best rate with p99 ≤ 1 s and the next, "
        f"{load_seconds:g} s each, one sentence per request drawn from the same sentences, "
        f"greedy, attnserve's default `max_length` (min(256, 2 × source + 10)) on both servers; latency from "
        f"each request's scheduled send time (no coordinated omission); attnserve at n threads runs n "
        f"decoding threads of one ONNX Runtime thread each (`ATTNSERVE_DECODE_THREADS=n`); a rate with errors "
        f"or p99 over "
        f"{stop_p99:g} s ends the sweep. The load generator runs on the same machine. One offline "
        f"CTranslate2 run (greedy, the same compute type and threads) just before and one just after each "
        f"attnserve sweep anchor its ratio: their mean is the rate it is compared with. The transformers "
        f"service is a plain FastAPI app (`python bench/peers.py --serve-transformers DIR`) that answers one "
        f"request at a time.\n\n{tables}\n\n{images}"
    )


def mixed_section(table: str) -> str:
    """The mixed load's BENCHMARKS.md section."""
    return f"### Mixed load: continuous against request-level batching\n\n{table}"


def peers_section(command: str, texts_note: str, sections: list[str]) -> str:
    """The whole peers section of BENCHMARKS.md: the command, the machine, ``texts_note`` (the bundle and the
    texts), then ``sections``."""
    return (
        "## Peers: CTranslate2, transformers, attnserve (bench/peers.py)\n\n"
        f"`{command}`\n\n"
        f"Machine: {machine()}. {versions('onnxruntime', 'ctranslate2', 'torch', 'transformers')}.\n\n"
        f"{texts_note}\n\n" + "\n\n".join(sections)
    )
