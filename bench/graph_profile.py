"""Where a runner's ONNX Runtime calls spend their time, by operator: ONNX Runtime's own profiler
(``SessionOptions.enable_profiling``) on the graphs that /translate uses, one thread, over test sentences decoded
greedily in batches as the service's batching loop admits them (unsorted, ``--batch`` at a time).

For each graph: its calls, the wall time of a call (``model_run``), the time its kernels took (the rest is the
session's own work between them), and the operators by time. A graph's node count is the number of kernels a call
runs: a decoding step of a few rows pays for each node as well as for its arithmetic. With ``--provider cuda``, also
the nodes that ONNX Runtime placed on the CPU, by operator (each one a copy to the host and back).

    python bench/graph_profile.py
    python bench/graph_profile.py --variant int8 --batch 8 --no-write
    python bench/graph_profile.py --provider cuda --json profile.json   # onnxruntime-gpu on a GPU
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from unittest import mock

from common import CORPUS, DOCS, ROOT, machine, texts, versions, write_section
from tqdm import tqdm

CPU = "CPUExecutionProvider"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--variant", default="float32", choices=["float32", "int8", "float16"])
    ap.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="ATTNSERVE_PROVIDER of the runner")
    ap.add_argument(
        "--texts", type=Path, default=CORPUS, help="one source per line, or a TSV (default: the test split)"
    )
    ap.add_argument("--sentences", type=int, default=600)
    ap.add_argument("--batch", type=int, default=28, help="texts decoded together (the service's rows a step)")
    ap.add_argument("--top", type=int, default=12, help="operators listed per graph")
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md goes here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--json", type=Path, default=None, help="also write the profiles here, as JSON")
    return ap.parse_args(argv)


@dataclass
class GraphProfile:
    """One session's profile: calls, their wall and kernel microseconds, per operator its µs and nodes, and per
    execution provider its nodes, with the operators of those on the CPU."""

    name: str
    calls: int
    run_us: float
    kernel_us: float
    op_us: Counter[str]
    op_nodes: Counter[str]
    provider_nodes: Counter[str] = field(default_factory=Counter)
    cpu_op_nodes: Counter[str] = field(default_factory=Counter)


def read_profile(path: Path, name: str) -> GraphProfile | None:
    """A profile file ONNX Runtime wrote; None for a session that never ran."""
    text = path.read_text()
    if not text.strip():
        return None
    op_us: Counter[str] = Counter()
    op_nodes: Counter[str] = Counter()
    provider_nodes: Counter[str] = Counter()
    cpu_op_nodes: Counter[str] = Counter()
    calls, run_us = 0, 0.0
    for event in json.loads(text):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op, provider = event["args"]["op_name"], event["args"].get("provider", "")
            op_us[op] += event["dur"]
            op_nodes[op] += 1
            provider_nodes[provider] += 1
            if provider == CPU:
                cpu_op_nodes[op] += 1
        elif event.get("cat") == "Session" and event["name"] == "model_run":
            calls += 1
            run_us += event["dur"]
    if not calls:
        return None
    return GraphProfile(name, calls, run_us, sum(op_us.values()), op_us, op_nodes, provider_nodes, cpu_op_nodes)


def profile(args: argparse.Namespace) -> list[GraphProfile]:
    """Decode the sentences with the runner of ``--variant`` under ONNX Runtime's profiler."""
    import onnxruntime as ort

    import service.runtime.runner as runner_module
    from service.decoding import decode
    from service.serving.engine import Engine
    from service.serving.translation import Options
    from service.settings import Settings

    out = Path(tempfile.mkdtemp(prefix="graph-profile-"))
    plain = runner_module.session_options

    def profiled(threads: int) -> ort.SessionOptions:
        opts = plain(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(out / "session")
        return opts

    settings = Settings(graph_variant=args.variant, threads=1, provider=args.provider, _env_file=None)
    with mock.patch.object(runner_module, "session_options", profiled):  # the engine's sessions write profiles
        engine = Engine.load(args.bundle, settings)
    fast = engine.runners.fast
    assert isinstance(fast, runner_module.Runner)
    requests = [engine._request(s, Options(), False) for s in texts(args.texts, args.sentences)]
    for i in tqdm(range(0, len(requests), args.batch), desc="decoding", unit="batch"):
        decode(fast, requests[i : i + args.batch])
    graphs = [("encoder", fast.encoder.end_profiling()), ("decoder step", fast.decoder.end_profiling())]
    return [p for name, path in graphs if (p := read_profile(Path(path), name)) is not None]


def section(args: argparse.Namespace, command: str, graphs: list[GraphProfile]) -> str:
    on = "" if args.provider == "cpu" else ", CUDA"
    lines = [
        f"## ONNX Runtime's time by operator, {args.variant}{on} (bench/graph_profile.py)",
        "",
        f"`{command}`",
        "",
        f"{machine()}; {versions('onnxruntime', 'onnxruntime-gpu')}. One thread; {args.sentences} test sentences "
        "decoded greedily "
        f"{args.batch} at a time, unsorted, by the runner that /translate uses; ONNX Runtime's profiler "
        "(`enable_profiling`). Kernel time: what the nodes' kernels took; the rest of a call is the session's own "
        "work between them.",
        "",
        "| graph | calls | µs a call | kernels µs a call | nodes a call | nodes on the CPU a call |",
        "|---|---|---|---|---|---|",
    ]
    for g in graphs:
        nodes, on_cpu = sum(g.op_nodes.values()) // g.calls, g.provider_nodes[CPU] // g.calls
        lines.append(
            f"| {g.name} | {g.calls} | {g.run_us / g.calls:.0f} | {g.kernel_us / g.calls:.0f} | {nodes} | {on_cpu} |"
        )
    if args.provider == "cuda":
        for g in graphs:
            placed = ", ".join(f"{op} ×{n // g.calls}" for op, n in g.cpu_op_nodes.most_common()) or "none"
            lines += ["", f"{g.name}, nodes on the CPU a call: {placed}."]
    for g in graphs:
        lines += ["", f"{g.name}, operators by time:", "", "| operator | µs a call | share of kernels | nodes a call |"]
        lines.append("|---|---|---|---|")
        for op, us in g.op_us.most_common(args.top):
            share = us / max(g.kernel_us, 1)
            lines.append(f"| {op} | {us / g.calls:.0f} | {share:.0%} | {g.op_nodes[op] // g.calls} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    words = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python bench/graph_profile.py", *(shlex.quote(w) for w in words)])
    graphs = profile(args)
    body = section(args, command, graphs)
    print(body, flush=True)
    if args.json is not None:
        counts = [{f.name: getattr(g, f.name) for f in fields(g)} for g in graphs]  # a Counter is a dict
        args.json.write_text(json.dumps({"command": command, "graphs": counts}, indent=1) + "\n")
    if not args.no_write:
        on = "" if args.provider == "cpu" else "cuda-"
        write_section(f"graph-profile-{on}{args.variant}", body, args.out / "BENCHMARKS.md")


if __name__ == "__main__":
    main()
