"""Many pairs in one process: resident memory and first-request latency with 20 bundles, all loaded at start-up and
loaded on first use under ATTNSERVE_MODELS_MEMORY_MB. Writes the ``pairs`` section of docs/BENCHMARKS.md.

The 20 bundles are copies of one bundle (the shipped en-ja by default) under other language codes: 10 into English
and 10 out of it (so 100 more pairs through the pivot language). Each server is a fresh ``attnserve serve``.

    python bench/pairs.py --bundles 20 --fit 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from common import ROOT, Server, free_port, machine, versions, write_section

sys.path.insert(0, str(ROOT))

from service.runtime.manifest import MANIFEST, Manifest

CODES = ["de", "fr", "es", "it", "pt", "nl", "sv", "pl", "ru", "uk", "tr", "ko", "zh", "ar", "fi", "cs", "da", "el",
         "hu", "ro"]  # fmt: skip
BODY = {"q": "Delete the selected files?"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja", help="the bundle to copy")
    ap.add_argument("--bundles", type=int, default=20, help="copies (an even number up to 2 × 10)")
    ap.add_argument("--fit", type=int, default=4, help="bundles the memory bound holds")
    ap.add_argument("--firsts", type=int, default=8, help="first requests timed on each server")
    ap.add_argument("--write", action="store_true", help="write the section of docs/BENCHMARKS.md")
    return ap.parse_args(argv)


def copies(bundle: Path, n: int, root: Path) -> list[tuple[Path, tuple[str, str]]]:
    """``n`` copies of ``bundle`` (its derived graphs written once first), half X→en and half en→Y."""
    source = Path(shutil.copytree(bundle, root / "source"))
    subprocess.run([str(Path(sys.executable).with_name("attnserve")), "derive", str(source)], check=True)
    out = []
    for i in range(n):
        code = CODES[i // 2]
        pair = (code, "en") if i % 2 == 0 else ("en", CODES[10 + i // 2])
        path = Path(shutil.copytree(source, root / f"{pair[0]}-{pair[1]}"))
        manifest = Manifest.read(path)
        manifest.name, manifest.source_lang, manifest.target_lang = path.name, *pair
        manifest.write(path)
        out.append((path, pair))
    return out


def rss_mb(pid: int) -> float:
    """A process's resident memory now (VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def serve(bundles: list[Path], env: dict[str, str]) -> Server:
    port = free_port()
    command = [str(Path(sys.executable).with_name("attnserve")), "serve", "--port", str(port)]
    for b in bundles:
        command += ["--bundle", str(b)]
    return Server(command, port, {"ATTNSERVE_LOG_LEVEL": "warning", **env}, ready_timeout=300)


def timed(c: httpx.Client, pair: tuple[str, str]) -> float:
    """Seconds for one /translate of ``pair``."""
    t0 = time.perf_counter()
    r = c.post("/translate", json={**BODY, "source": pair[0], "target": pair[1]})
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0


def run(pairs: list[tuple[str, str]], bundles: list[Path], env: dict[str, str], firsts: int) -> dict[str, float]:
    """Start a server, time its start, its RSS, ``firsts`` first requests (each to a pair not asked before) and as
    many second requests to the last of those, then its RSS after every pair was asked once."""
    t0 = time.perf_counter()
    with serve(bundles, env) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        ready_s = time.perf_counter() - t0
        rss_ready = rss_mb(server.process.pid)
        first = [timed(c, p) for p in pairs[:firsts]]
        again = [timed(c, pairs[firsts - 1]) for _ in range(firsts)]
        for p in pairs[firsts:]:
            timed(c, p)
        rss_all = rss_mb(server.process.pid)
        metrics = c.get("/metrics").text
    loads = sum(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("attnserve_model_loads_total{"))
    return {
        "ready_s": ready_s,
        "rss_ready": rss_ready,
        "rss_all": rss_all,
        "first_ms": statistics.median(first) * 1000,
        "first_max_ms": max(first) * 1000,
        "again_ms": statistics.median(again) * 1000,
        "loads": loads,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        made = copies(args.bundle, args.bundles, Path(tmp))
        bundles, pairs = [p for p, _ in made], [pair for _, pair in made]
        disk_mb = sum(f.stat().st_size for f in bundles[0].iterdir() if f.name != MANIFEST) / (1 << 20)
        bound = int(args.fit * disk_mb) + 1
        eager = run(pairs, bundles, {"ATTNSERVE_EAGER_MODELS": str(args.bundles)}, args.firsts)
        lazy = run(
            pairs, bundles, {"ATTNSERVE_EAGER_MODELS": "0", "ATTNSERVE_MODELS_MEMORY_MB": str(bound)}, args.firsts
        )
    print(json.dumps({"disk_mb": disk_mb, "bound_mb": bound, "eager": eager, "lazy": lazy}, indent=1))
    if args.write:
        write_section("pairs", report(args, disk_mb, bound, eager, lazy))


def report(
    args: argparse.Namespace, disk_mb: float, bound: int, eager: dict[str, float], lazy: dict[str, float]
) -> str:
    n, f = args.bundles, args.firsts
    rows = [
        (f"all {n} loaded at start-up (`EAGER_MODELS={n}`, no bound)", eager),
        (f"on first use, `MODELS_MEMORY_MB={bound}` ({args.fit} bundles), none eager", lazy),
    ]
    lines = [
        "## Many pairs",
        "",
        f"{n} copies of `{args.bundle.relative_to(ROOT)}` ({disk_mb:.1f} MiB on disk each, float32 and int8 graphs) "
        f"under other language codes, {n // 2} into English and {n // 2} out of it ({(n // 2) ** 2} more "
        "pairs through English), one fresh `attnserve serve` each way (float32, one thread, defaults otherwise). "
        f"First request: a /translate of a pair not asked before (median and worst of {f} pairs); loaded pair: "
        f"{f} more to the last of them. RSS (VmRSS) once ready, and after every pair was asked once.",
        "",
        "| server | ready after | RSS ready | RSS, every pair asked | first request | loaded pair | loads |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['ready_s']:.1f} s | {r['rss_ready']:.0f} MiB | {r['rss_all']:.0f} MiB | "
            f"{r['first_ms']:.0f} ms (worst {r['first_max_ms']:.0f}) | {r['again_ms']:.0f} ms | {r['loads']:.0f} |"
        )
    per = (eager["rss_all"] - lazy["rss_ready"]) / n
    lines += [
        "",
        f"A loaded bundle adds about {per:.0f} MiB of RSS ({per / disk_mb:.1f}× its size on disk; "
        "`ATTNSERVE_MODELS_MEMORY_MB` counts its loaded weights, `attnserve models`). A first request to an "
        "unloaded pair pays the load: ONNX Runtime sessions, schedulers and warm-up (and an unload first when the "
        "bound is reached).",
        "",
        f"`{' '.join(['python bench/pairs.py', *(argv_of(args))])}` on {machine()}; {versions('onnxruntime')}.",
    ]
    return "\n".join(lines)


def argv_of(args: argparse.Namespace) -> list[str]:
    return [f"--bundles {args.bundles}", f"--fit {args.fit}", f"--firsts {args.firsts}", "--write"]


if __name__ == "__main__":
    main()
