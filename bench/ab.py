"""Two checkouts side by side, interleaved, for a change that must not move the numbers (a refactor): bench/peers.py's
offline engine runs (attnserve's runner alone, each run in a process of its own, CTranslate2 beside them as the
anchor) and bench/batching.py's closed-loop HTTP throughput.

    python bench/ab.py --before ../attnserve-old --rounds 3

Each checkout runs its own code through its own virtual environment (``<checkout>/.venv``, as ``make test`` makes
it) on its own shipped bundle; the test sentences, their token ids and the CTranslate2 model are shared. Prints a
Markdown table: per measurement the median of the rounds for each checkout, and after / before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
from pathlib import Path

from batching import closed_loop
from common import ROOT, Server, free_port, texts
from engines import prepare
from peers import load_texts, parse_args
from tqdm import tqdm

from service.runtime.bundle import load_bundle

BUNDLE = Path("model") / "bundles" / "en-ja"
ENGINES = [("attnserve", "float32"), ("attnserve", "int8"), ("ctranslate2", "float32"), ("ctranslate2", "int8")]


def write_setups(before: Path, work: Path, sentences: int) -> dict[str, Path]:
    """A peers work directory per checkout: the same sources and CTranslate2 model, each checkout's own bundle."""
    args = parse_args(["--sentences", str(sentences)])
    prepared = prepare(ROOT / BUNDLE, work / "after")
    source = load_texts(args, load_bundle(ROOT / BUNDLE))
    setup: dict[str, object] = {"hf": str(prepared.hf), "ct2": str(prepared.ct2)}
    setup |= {"sources": source.sources, "max_length": source.max_length}
    works = {"before": work / "before", "after": work / "after"}
    for name, checkout in (("before", before), ("after", ROOT)):
        works[name].mkdir(parents=True, exist_ok=True)
        bundle = prepared.bundle if name == "after" else checkout / BUNDLE
        (works[name] / "setup.json").write_text(json.dumps({**setup, "bundle": str(bundle)}))
    return works


def offline_seconds(checkout: Path, work: Path, engine: str, compute: str, beam: int) -> float:
    """One bench/peers.py engine run of ``checkout``'s code: its seconds for every sentence."""
    command = [str(checkout / ".venv" / "bin" / "python"), "bench/peers.py", "--engine", engine, "--compute", compute]
    command += ["--beam", str(beam), "--threads", "1", "--work", str(work)]
    proc = subprocess.run(
        command, capture_output=True, text=True, cwd=checkout, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return float(json.loads(line[len("RESULT ") :])["seconds"])


def http_rate(checkout: Path, sentences: list[str], clients: int, seconds: float) -> float:
    """``checkout``'s ``attnserve serve`` (one thread, default batching) under bench/batching.py's closed loop."""
    port = free_port()
    command = [str(checkout / ".venv" / "bin" / "attnserve"), "serve", "--bundle", str(checkout / BUNDLE)]
    env = {"ATTNSERVE_LOG_LEVEL": "warning", "ATTNSERVE_THREADS": "1"}
    with Server([*command, "--port", str(port)], port, env) as server:
        asyncio.run(closed_loop(server.url, sentences, clients, 3))  # warm-up
        return asyncio.run(closed_loop(server.url, sentences, clients, seconds))["sentences/s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (with its .venv)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/attnserve-ab"), help="conversions and setups")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--http-seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=32)
    args = ap.parse_args()
    before = args.before.resolve()
    works = write_setups(before, args.work, args.sentences)
    checkouts = {"before": before, "after": ROOT}
    sentences = texts(parse_args([]).texts)
    results: dict[tuple[str, str], list[float]] = {}
    runs = [(e, c, b) for b in args.beams for e, c in ENGINES]
    for r in tqdm(range(args.rounds), desc="rounds"):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for engine, compute, beam in runs:
            label = f"{engine} {compute} {'greedy' if beam == 1 else f'beam {beam}'} (s)"
            for name in order if engine == "attnserve" else ["after"]:  # CTranslate2 is the same in both
                seconds = offline_seconds(checkouts[name], works[name], engine, compute, beam)
                results.setdefault((label, name), []).append(seconds)
        for name in order:
            rate = http_rate(checkouts[name], sentences, args.clients, args.http_seconds)
            results.setdefault((f"HTTP, {args.clients} closed-loop clients (sentences/s)", name), []).append(rate)
    print("| measurement | before | after | after / before |\n|---|---|---|---|")
    for label in dict.fromkeys(label for label, _ in results):
        after = statistics.median(results[label, "after"])
        if (label, "before") not in results:
            print(f"| {label} | {after:.2f} | {after:.2f} | (same engine) |")
            continue
        old = statistics.median(results[label, "before"])
        print(f"| {label} | {old:.2f} | {after:.2f} | {after / old:.3f} |")


if __name__ == "__main__":
    main()
