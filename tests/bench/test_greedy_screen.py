"""bench/greedy_screen.py: the runners side by side on one bundle, each checked against the exact runner's tokens."""

from __future__ import annotations

from pathlib import Path

import greedy_screen
import pytest


def test_the_table_compares_every_runner_with_the_exact_one(tiny_bundle: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--models", "trained", "--trained", str(tiny_bundle), "--texts", "4", "--batch", "2", "--rounds", "1"]
    assert greedy_screen.main([*args, "--max-length", "8"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| trained")]
    assert [r[1] for r in rows] == ["exact", "fast"]
    assert all(r[-1] == "4/4 |" for r in rows)
