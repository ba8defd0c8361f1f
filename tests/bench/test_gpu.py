"""bench/gpu.py: it stops clearly without CUDA; its logic runs end to end with the CPU standing in for the GPU."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import onnxruntime as ort
import pytest

try:
    import ctranslate2  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("ctranslate2 is not installed (pip install -e '.[dev]')", allow_module_level=True)

import gpu


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
    assert "attnserve runner (CUDA EP, IOBinding) | float32 | greedy | 4 |" in text
    assert not plots or (tmp_path / "gpu-throughput.png").stat().st_size > 0
    raw = json.loads((tmp_path / "gpu.json").read_text())
    assert raw["check"]["identical"] == 4 and raw["check"]["passed"] and raw["provider"] == "CPUExecutionProvider"
    assert {(r["key"], r["batch"]) for r in raw["rows"]} >= {("attnserve", 1), ("attnserve", 4)}
    assert all(r["target_tokens_per_s"] > 0 for r in raw["rows"] if r["error"] is None)
