"""bench/graph_profile.py: ONNX Runtime's profile of the shipped bundle's graphs, read back by operator."""

from __future__ import annotations

import json
from pathlib import Path

import graph_profile


def test_a_profile_file_is_read_by_operator(tmp_path: Path) -> None:
    def node(op: str, us: int) -> dict[str, object]:
        return {"cat": "Node", "name": f"{op}_1_kernel_time", "dur": us, "args": {"op_name": op}}

    run = {"cat": "Session", "name": "model_run", "dur": 100}
    events = [run, node("MatMul", 60), node("Add", 10), run, node("MatMul", 50), node("Add", 20), node("Add", 1)]
    events.append({"cat": "Session", "name": "session_initialization", "dur": 5000})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events))
    profile = graph_profile.read_profile(path, "decoder step")
    assert profile is not None
    assert (profile.calls, profile.run_us, profile.kernel_us) == (2, 200, 141)
    assert profile.op_us.most_common() == [("MatMul", 110), ("Add", 31)]
    assert profile.op_nodes == {"MatMul": 2, "Add": 3}
    (tmp_path / "never.json").write_text("")
    assert graph_profile.read_profile(tmp_path / "never.json", "encoder") is None


def test_the_shipped_bundles_graphs_are_profiled(tmp_path: Path) -> None:
    sources = tmp_path / "sources.tsv"
    sources.write_text("".join(f"Open {n} files from the list.\tref\n" for n in range(12)))
    graph_profile.main(["--texts", str(sources), "--sentences", "12", "--batch", "5", "--out", str(tmp_path)])
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "<!-- bench:graph-profile-float32 -->" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith(("| encoder |", "| decoder step |"))]
    calls = {row[0].strip("| "): int(row[1]) for row in rows}
    assert calls["encoder"] == 3  # 12 texts, 5 at a time
    assert calls["decoder step"] >= 3
    assert "| MatMul |" in text


def test_nodes_are_counted_by_the_provider_that_ran_them(tmp_path: Path) -> None:
    def node(op: str, provider: str) -> dict[str, object]:
        args = {"op_name": op, "provider": provider}
        return {"cat": "Node", "name": f"{op}_kernel_time", "dur": 5, "args": args}

    run = {"cat": "Session", "name": "model_run", "dur": 100}
    cuda, cpu = "CUDAExecutionProvider", "CPUExecutionProvider"
    step = [run, node("MatMul", cuda), node("MemcpyToHost", cuda), node("TopK", cpu), node("MemcpyFromHost", cuda)]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(step + step))
    profile = graph_profile.read_profile(path, "decoder step")
    assert profile is not None
    assert profile.provider_nodes == {cuda: 6, cpu: 2} and profile.cpu_op_nodes == {"TopK": 2}
    args = graph_profile.parse_args(["--provider", "cuda"])
    text = graph_profile.section(args, "python bench/graph_profile.py --provider cuda", [profile])
    assert "## ONNX Runtime's time by operator, float32, CUDA" in text
    assert "| decoder step | 2 | 100 | 20 | 4 | 1 |" in text
    assert "decoder step, nodes on the CPU a call: TopK ×1." in text
