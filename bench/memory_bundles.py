"""What loading a bundle adds to a process's resident memory, beside the weights its sessions hold: for each bundle and
variant, a fresh process reads the bundle (manifest, tokenizer), then builds the engine's runners as the server does
(service/serving/engine.py's ``Runners.build``, on the CPU, one thread) and warms it up; RSS growth is VmRSS then
minus VmRSS before, after the heap's free memory went back to the system (as the server's idle trim does). Then one
/attention opens the exact float32 graphs, and the growth is taken again beside the weights they add.

    python -m bench.import_time /tmp/mem-base && attnserve import-marian /tmp/mem-base /tmp/mem-base-bundle
    attnserve derive /tmp/mem-base-bundle
    python bench/memory_bundles.py /tmp/mem-base-bundle model/bundles/en-ja --write
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

from common import machine, versions, write_section

from service.runtime.manifest import Manifest

MiB = 1 << 20


def rss_mib() -> tuple[float, float]:
    """This process's VmRSS and the part of it mapped from files (RssFile), MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["RssFile"].split()[0]) / 1024


def measure(bundle_dir: Path, variant: str) -> dict[str, float]:
    """In this process: the RSS growth of loading and warming ``bundle_dir`` to serve ``variant``, then of its first
    /attention, with the weights counted for each (MiB)."""
    from service.runtime.bundle import load_bundle
    from service.runtime.runner import trim_memory
    from service.serving.catalog import disk_bytes, loaded_bytes
    from service.serving.engine import Engine, Runners
    from service.serving.translation import Filters, Options
    from service.settings import Settings

    settings = Settings(bundles=[bundle_dir], graph_variant=variant, provider="cpu", threads=1)
    bundle = load_bundle(bundle_dir)

    def settled() -> tuple[float, float]:
        gc.collect()
        trim_memory()
        return rss_mib()

    before, file_before = settled()
    engine = Engine(bundle, settings, Runners.build(bundle, settings))
    engine.warm_up()
    served, file_served = settled()
    start = time.perf_counter()
    engine.attention_now(["Open the file."], Options(max_length=8), Filters())
    first = time.perf_counter() - start
    start = time.perf_counter()
    engine.attention_now(["Save the file."], Options(max_length=8), Filters())
    second = time.perf_counter() - start
    with_exact, _ = settled()
    return {
        "disk": disk_bytes(bundle.path, bundle.manifest) / MiB,
        "model": model_weights(bundle.path, bundle.manifest),
        "weights": loaded_bytes(bundle.path, bundle.manifest, variant, exact=False) / MiB,
        "rss": served - before,
        "file": file_served - file_before,
        "weights_exact": loaded_bytes(bundle.path, bundle.manifest, variant) / MiB,
        "rss_exact": with_exact - before,
        "first_ms": 1000 * first,
        "next_ms": 1000 * second,
    }


def model_weights(bundle_dir: Path, manifest: Manifest) -> float:
    """The model's own weights, each once, as float32 (MiB): the initializers of its exact encoder and decoder, which
    hold every weight of the model and nothing derived from them, by name (a tied embedding is one), float16-stored
    ones counted as the float32 they load as."""
    from service.serving.catalog import initializer_bytes

    sizes: dict[str, int] = {}
    for role in ("encoder", "decoder"):
        sizes.update(initializer_bytes(bundle_dir / manifest.graphs[role]))
    return sum(sizes.values()) / MiB


def row(name: str, variant: str, m: dict[str, float]) -> str:
    weights = m["model"] if variant == "float32" else m["weights"]
    return (
        f"| {name} | {variant} | {weights:.1f} | {m['weights']:.1f} | {m['disk']:.1f} "
        f"| {m['rss']:.1f} ({m['file']:.1f}) "
        f"| {m['rss'] / weights:.2f}× | {m['weights_exact']:.1f} | {m['rss_exact']:.1f} "
        f"| {m['rss_exact'] / m['weights_exact']:.2f}× | {m['first_ms']:.0f} / {m['next_ms']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundles", nargs="*", type=Path)
    parser.add_argument("--variants", default="float32,int8", help="comma-separated; a bundle without one skips it")
    parser.add_argument("--write", action="store_true", help="write the table into docs/BENCHMARKS.md")
    parser.add_argument("--child", nargs=2, metavar=("BUNDLE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), args.child[1])))
        return
    rows = []
    for bundle in args.bundles:
        manifest = Manifest.read(bundle)
        for variant in args.variants.split(","):
            if variant not in manifest.variants:
                continue
            child = [sys.executable, __file__, "--child", str(bundle), variant]
            out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
            rows.append(row(manifest.name, variant, json.loads(out.splitlines()[-1])))
            print(rows[-1], flush=True)
    command = " ".join(["python bench/memory_bundles.py", *sys.argv[1:]])
    body = "\n".join(
        [
            "## Memory of a loaded bundle (bench/memory_bundles.py)",
            "",
            f"`{command}` on {machine()}; {versions('onnxruntime')}; the machine shared with other work.",
            "",
            "Each row a fresh process, on the CPU, one thread: RSS growth is VmRSS after building the "
            "engine's runners and its warm-up, minus VmRSS before (the bundle's manifest and tokenizer already "
            "read), both after the heap's free memory went back to the system. Weights: float32's, the model's "
            "own weights, each once (its exact graphs' initializers by name: a tied embedding once, nothing derived "
            "from them); int8's, the initializers of its sessions. Sessions' initializers: what the sessions opened "
            "hold (float16-stored weights as the float32 they load as), derived arrays and a weight that two "
            "sessions hold counted in each, as `attnserve models` shows them and the registry's memory bound counts "
            "them (`loaded` there counts the exact graphs too); in brackets the part of the growth mapped from "
            "files (RssFile: weights.bin pages ONNX Runtime reads in place, and code first run). The exact float32 "
            "graphs open on the first /attention, `return_details` or span placement: the columns after the ratio "
            "are taken after two /attention calls, the first of which opened them (its time, then the second's).",
            "",
            "| bundle | serves | weights MiB | sessions' initializers MiB | disk MiB | RSS growth MiB (from files) "
            "| ratio to the weights | with exact graphs: sessions' initializers MiB | RSS growth MiB | ratio "
            "| /attention ms, first / next |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    if args.write:
        write_section("memory-bundles", body)
    print(body)


if __name__ == "__main__":
    main()
