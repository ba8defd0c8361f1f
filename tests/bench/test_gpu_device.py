"""bench/gpu_device.sh --smoke: the device call's steps end to end on the CPU, tiny sizes, nothing installed; every
result file written, and no more files than a `run` call brings back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Open file", "Save the file", "Delete the selected files?", "Settings", "Close the window", "Print"]
RETURNED = 8  # files a `run` call brings back from $OUT


@pytest.mark.timeout(900)
def test_the_smoke_run_writes_every_result(tiny_bundle: Path, tmp_path: Path) -> None:
    texts, out = tmp_path / "texts.tsv", tmp_path / "out"
    texts.write_text("".join(f"{text}\treference\n" for text in TEXTS))
    command = ["bash", str(ROOT / "bench" / "gpu_device.sh"), "--smoke", "--bundle", str(tiny_bundle)]
    env = os.environ | {"OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run([*command, "--texts", str(texts)], env=env, capture_output=True, text=True, timeout=850)
    log = (out / "run.log").read_text() if (out / "run.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log[-6000:]
    assert done.stdout.count(": exit 0 after") == 6, done.stdout  # extensions, sanity, gpu, 2 profiles, http

    results = {path.name for path in out.iterdir()}
    assert {"run.log", "sanity.json", "gpu.json", "BENCHMARKS.md", "profile.json", "http.json"} <= results
    assert len(results) <= RETURNED - 1, results  # one left for bench/gpu.py's plot (matplotlib)

    assert json.loads((out / "sanity.json").read_text())["chosen"] == "CPUExecutionProvider"
    gpu = json.loads((out / "gpu.json").read_text())
    assert gpu["check"]["passed"] and gpu["provider"] == "CPUExecutionProvider"
    measured = {(r["key"], r["compute"], r["beam"], r["batch"]) for r in gpu["rows"] if r["error"] is None}
    assert measured == {(k, c, beam, batch) for k in ("attnserve", "attnserve-device") for c in ("float32", "float16")
                        for beam in (1, 4) for batch in (1, 4)}  # fmt: skip
    assert {(s["runner"], s["batch"]) for s in gpu["breakdown"]} == {(r, n) for r in ("old", "new") for n in (1, 4)}
    assert set(gpu["cuda_graph"]) == {"float32", "float16"}
    sections = (out / "BENCHMARKS.md").read_text()
    for section in ("gpu", "graph-profile-float32", "graph-profile-float16"):
        assert f"<!-- bench:{section} -->" in sections
    graphs = {g["name"]: g for g in json.loads((out / "profile.json").read_text())["graphs"]}
    assert graphs["decoder step"]["calls"] > 0 and graphs["decoder step"]["provider_nodes"]
    http = json.loads((out / "http.json").read_text())
    assert http["closed_loop"]["sentences"] > 0 and http["closed_loop"]["errors"] == 0
    assert http["metrics"] == {"gpu_memory_bytes": None, "provider": ["CPUExecutionProvider"]}


@pytest.mark.timeout(2400)
def test_the_rehearsal_of_the_gpu_machines_calls_passes() -> None:
    """bench/gpu_device.sh --rehearse: HEAD's calls on the GPU machine's Python 3.12 and packages, downloaded from
    PyPI (so only where CI=true: never skipped in CI)."""
    if os.environ.get("CI") != "true":
        pytest.skip("downloads from PyPI: runs in CI (CI=true)")
    command = ["bash", str(ROOT / "bench" / "gpu_device.sh"), "--rehearse"]
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=2300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    assert "measuring call:" in done.stdout and "rehearse: passed" in done.stdout, done.stdout
