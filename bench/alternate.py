"""One setting's effect under bench/overhead.py's load, measured in alternating pairs: two ``attnserve serve``
processes pinned to the same core at once, one with the defaults and one with ``--set`` settings, and the closed-loop
clients (on the other core) loading them in turn in short runs, the order swapped every pair. The machine's speed
drifts by more than 10 % between runs a minute apart, more than a scheduling or allocation change is worth; runs
seconds apart share the drift, so the ratio of each pair is steadier than the ratio of two separate series. Each
server is warmed up with 2 s of the same load first. For float32 and int8; writes section
``alternate-<the first setting's name>-<its value>`` of docs/BENCHMARKS.md.

    python bench/alternate.py --set ATTNSERVE_SCHED_BATCH=off
    python bench/alternate.py --set ATTNSERVE_SCHED_BATCH=always --pairs 1 --seconds 1 --sentences 40 --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from common import DOCS, machine, versions, write_section
from overhead import CLIENT_CORE, SERVER_CORE, add_load_arguments, attnserve_server, closed_loop, request_bodies
from tqdm import tqdm

VARIANTS = ("float32", "int8")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="settings", action="append", required=True, metavar="ATTNSERVE_NAME=VALUE",
                    help="a setting of the second server (repeatable); the first runs with the defaults")  # fmt: skip
    add_load_arguments(ap, seconds=5)
    ap.add_argument("--pairs", type=int, default=16, help="pairs of runs a graph variant")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md goes here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if not all(s.startswith("ATTNSERVE_") and "=" in s for s in args.settings):
        ap.error("--set takes ATTNSERVE_NAME=VALUE")
    return args


def context_switches(pid: int) -> int:
    """A process's context switches so far, every thread's, voluntary (it waited) and not (it was preempted)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        for line in status.splitlines():
            if "ctxt_switches:" in line:  # voluntary_ctxt_switches, nonvoluntary_ctxt_switches
                total += int(line.split()[1])
    return total


@dataclass
class Pairs:
    """A graph variant's pairs: sentences/s of the defaults' runs and of the changed server's, pair by pair, and
    each run's context switches a request."""

    variant: str
    defaults: list[float] = field(default_factory=list)
    changed: list[float] = field(default_factory=list)
    switches: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))

    @property
    def ratios(self) -> list[float]:
        """Defaults / changed, pair by pair."""
        return [d / c for d, c in zip(self.defaults, self.changed, strict=True)]

    def row(self) -> str:
        ratios = self.ratios
        won = sum(r > 1 for r in ratios)
        switches = " / ".join(f"{statistics.median(s):.2f}" for s in self.switches)
        return (f"| {self.variant} | {len(ratios)} | {statistics.median(self.defaults):.1f} | "
                f"{statistics.median(self.changed):.1f} | **{statistics.median(ratios):.3f}×** "
                f"({min(ratios):.2f}–{max(ratios):.2f}) | {won} of {len(ratios)} | {switches} |")  # fmt: skip


def alternate(args: argparse.Namespace, variant: str, settings: dict[str, str], bodies: list[dict]) -> Pairs:
    """Both servers of ``variant`` up at once, warmed up, then ``--pairs`` pairs of runs."""
    pairs = Pairs(variant)
    attnserve = [str(Path(sys.executable).with_name("attnserve"))]
    graphs = {"ATTNSERVE_GRAPH_VARIANT": variant}
    with ExitStack() as stack:
        started = (attnserve_server(args.bundle, graphs | env, attnserve) for env in ({}, settings))
        servers = [stack.enter_context(server) for server in started]
        for server in servers:
            asyncio.run(closed_loop(server.url, bodies, args.clients, 2.0))
        runs = (pairs.defaults, pairs.changed)
        for p in tqdm(range(args.pairs), desc=variant, unit="pair"):
            for i in (0, 1) if p % 2 == 0 else (1, 0):
                before = context_switches(servers[i].process.pid)
                rate = asyncio.run(closed_loop(servers[i].url, bodies, args.clients, args.seconds))[0]
                runs[i].append(rate)
                pairs.switches[i].append((context_switches(servers[i].process.pid) - before) / (rate * args.seconds))
    return pairs


def section(args: argparse.Namespace, command: str, results: list[Pairs], sentences: int) -> str:
    changed = ", ".join(f"`{s}`" for s in args.settings)
    rows = "\n".join(p.row() for p in results)
    return f"""## The defaults against {changed}, alternating (bench/alternate.py)

`{command}`

{machine()}; {versions("onnxruntime", "uvicorn")}. Both servers pinned to core {SERVER_CORE} at once, the load
generator to core {CLIENT_CORE}; {args.clients} closed-loop clients, one sentence a request, {sentences} test
sentences, greedy; the clients load one server for {args.seconds:g} s, then the other, the order swapped every
pair. The ratio is the defaults' sentences/s over the other server's, pair by pair: above 1, the defaults are
faster. Context switches: every thread's, voluntary and preempted, over the answers of a run (/proc), median.

| graphs | pairs | defaults, sentences/s (median) | {changed} (median) | defaults / {changed}, pairs' median (range) | \
pairs the defaults won | context switches a request, defaults / {changed} |
|---|---|---|---|---|---|---|
{rows}
"""


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    os.sched_setaffinity(0, {int(CLIENT_CORE)})
    settings = dict(s.split("=", 1) for s in args.settings)
    bodies = request_bodies(args.bundle, args.texts, args.sentences)
    results = [alternate(args, variant, settings, bodies) for variant in args.variants]
    words = argv if argv is not None else sys.argv[1:]
    command = "python bench/alternate.py " + " ".join(shlex.quote(a) for a in words)
    body = section(args, command, results, len(bodies))
    print("\n" + body, flush=True)
    if not args.no_write:
        name, value = args.settings[0].split("=", 1)
        write_section(f"alternate-{name.removeprefix('ATTNSERVE_').lower()}-{value}", body, args.out / "BENCHMARKS.md")


if __name__ == "__main__":
    main()
