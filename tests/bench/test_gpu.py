"""bench/gpu.py: it stops clearly without CUDA; its logic runs end to end with the CPU standing in for the GPU."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

import gpu
import onnxruntime as ort
import pytest

from tests.bench.peer_engines import need_ctranslate2

need_ctranslate2()


def test_without_cuda_it_says_so(tiny_bundle: Path) -> None:
    if gpu.CUDA in ort.get_available_providers():
        pytest.skip("this machine has a CUDA execution provider")
    with pytest.raises(SystemExit, match="no CUDA execution provider"):
        gpu.main(["--bundle", str(tiny_bundle), "--no-write"])


def test_runs_with_the_cpu_standing_in(tiny_bundle: Path, tmp_path: Path) -> None:
    plots = importlib.util.find_spec("matplotlib") is not None  # the bench extra's; the dev extra does without it
    args = ["--bundle", str(tiny_bundle), "--sentences", "4", "--check-sentences", "4", "--batch-sizes", "1", "4"]
    args += ["--provider", "cpu"]
    args += ["--repeats", "1", "--max-length", "10", "--out", str(tmp_path), "--results", str(tmp_path / "gpu.json")]
    assert gpu.main(args) == 0  # CPU = CPU: the check passes
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "**PASS**: 4/4" in text
    assert "attnserve runner (CPU EP, IOBinding) | float32 | greedy | 4 |" in text
    assert not plots or (tmp_path / "gpu-throughput.png").stat().st_size > 0
    raw = json.loads((tmp_path / "gpu.json").read_text())
    assert raw["check"]["identical"] == 4 and raw["check"]["passed"] and raw["provider"] == "CPUExecutionProvider"
    assert {(r["key"], r["batch"]) for r in raw["rows"]} >= {("attnserve", 1), ("attnserve", 4)}
    assert all(r["target_tokens_per_s"] > 0 for r in raw["rows"] if r["error"] is None)


def test_smoke_compares_the_old_and_new_runner_on_the_cpu(tiny_bundle: Path, tmp_path: Path) -> None:
    """--smoke: the old runner (exact graphs) and the new one (the device decoder) on ONNX Runtime's CPU execution
    provider, float32 and float16: the tokens check, throughput rows, each step's time split, the CUDA-graph trial
    (not tried without CUDA)."""
    args = ["--bundle", str(tiny_bundle), "--smoke", "--out", str(tmp_path), "--results", str(tmp_path / "gpu.json")]
    assert gpu.main(args) == 0
    raw = json.loads((tmp_path / "gpu.json").read_text())
    check = raw["check"]
    assert raw["provider"] == "CPUExecutionProvider" and check["passed"]
    assert check["device_decoder_identical"] == check["device_decoder_beam_identical"] == check["n"] > 0
    keys = {(r["key"], r["compute"], r["beam"], r["batch"]) for r in raw["rows"] if r["error"] is None}
    assert keys == {(k, c, b, n) for k in ("attnserve", "attnserve-device") for c in ("float32", "float16")
                    for b in (1, 4) for n in (1, 4)}  # fmt: skip
    steps = raw["breakdown"]
    assert {(s["runner"], s["variant"], s["beam"], s["batch"]) for s in steps} == {
        (r, c, b, n) for r in ("old", "new") for c in ("float32", "float16") for b in (1, 4) for n in (1, 4)
    }
    for s in steps:
        ms = s["per_step_ms"]
        assert (
            s["steps"] > 0
            and ms["decoder run"] > 0
            and ms["step"] == pytest.approx(sum(s["seconds"].values()) * 1e3 / s["steps"])
        )
    for variant in ("float32", "float16"):
        trial = raw["cuda_graph"][variant]
        assert trial["without"]["verdict"] == "ran" and trial["without"]["step_ms_median"] > 0
        assert trial["with"]["verdict"].startswith("not tried")
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "attnserve device decoder (CPU EP) | float16 | beam 4 | 4 |" in text
    assert "### Where a step's time goes" in text and "### CUDA graphs" in text


def test_each_stage_is_written_as_it_ends_and_each_shape_warmed_up(
    tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped in a stage (a step's time limit on the GPU machine) keeps gpu.json as the stages before it left
    it; every measured shape ran once untimed before its timed runs."""
    import engines

    calls: Counter[tuple[int, int, int]] = Counter()
    translate = engines.translate

    def counted(engine: Any, sources: list[list[int]], beam: int, max_length: int, batch_size: int = 32) -> Any:
        calls[(id(engine), beam, batch_size)] += 1
        return translate(engine, sources, beam, max_length, batch_size)

    def stopped(*args: object) -> None:
        raise KeyboardInterrupt  # as `timeout` stops a step

    monkeypatch.setattr(engines, "translate", counted)
    monkeypatch.setattr(gpu, "breakdown", stopped)
    args = ["--bundle", str(tiny_bundle), "--smoke", "--out", str(tmp_path), "--results", str(tmp_path / "gpu.json")]
    with pytest.raises(KeyboardInterrupt):
        gpu.main(args)
    raw = json.loads((tmp_path / "gpu.json").read_text())
    assert raw["check"]["passed"] and raw["breakdown"] == [] and raw["cuda_graph"] == {}
    assert len(raw["rows"]) == 16 and all(len(r["seconds"]) == 1 for r in raw["rows"])
    shapes = {key: n for key, n in calls.items() if key[2] in (1, 4)}
    assert len(shapes) == 4 * 2 * 2 and set(shapes.values()) == {2}  # engines × beams × batches: warm-up and 1 run
