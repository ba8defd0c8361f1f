"""bench/alternate.py: the defaults and a changed setting, two servers loaded in turn, pair by pair."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alternate import Pairs, parse_args

from tests.service.process import REPO


def test_the_ratio_is_the_defaults_over_the_changed_server_pair_by_pair() -> None:
    pairs = Pairs("int8", defaults=[110.0, 90.0, 100.0], changed=[100.0, 100.0, 80.0])
    pairs.switches[0].extend([0.3, 0.4, 0.2])
    pairs.switches[1].extend([1.5, 1.2, 1.3])
    assert pairs.ratios == [1.1, 0.9, 1.25]
    assert pairs.row() == "| int8 | 3 | 100.0 | 100.0 | **1.100×** (0.90–1.25) | 2 of 3 | 0.30 / 1.30 |"


def test_only_attnserve_settings_are_taken() -> None:
    assert parse_args(["--set", "ATTNSERVE_SCHED_BATCH=off"]).settings == ["ATTNSERVE_SCHED_BATCH=off"]
    with pytest.raises(SystemExit):
        parse_args(["--set", "OMP_NUM_THREADS=2"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the servers and the clients take a core each")
def test_two_servers_loaded_in_turn(tiny_bundle: Path, tmp_path: Path) -> None:
    texts = tmp_path / "test.tsv"
    texts.write_text("".join(f"Open file number {n}.\tファイル\n" for n in range(6)))
    command = [sys.executable, "bench/alternate.py", "--set", "ATTNSERVE_MAX_BATCH_SIZE=2", "--variants", "float32"]
    command += ["--bundle", str(tiny_bundle), "--texts", str(texts), "--pairs", "2", "--seconds", "0.3"]
    command += ["--clients", "4", "--no-write"]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = [line for line in run.stdout.splitlines() if line.startswith("| float32 |")]
    cells = row.split(" | ")
    assert cells[1] == "2" and cells[-2] == "2 of 2", row
    assert all(float(n) > 0 for n in cells[-1].rstrip(" |").split(" / ")), row  # a request wakes the server
