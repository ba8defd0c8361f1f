"""Helpers shared by the deployment tests: the repository root, finding and running the checking tools."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "attnserve.json"
# Grafana variables in the dashboard's queries and what the tests put in their place.
DASHBOARD_VARIABLES = {"$__rate_interval": "1m", "$instance": ".*", "$pair": ".*"}
# Metrics a server exports only while a bundle runs on CUDA (service/metrics.py): on the CPU their panels are empty.
CUDA_ONLY = ("attnserve_gpu_memory_bytes",)


def require_tool(name: str) -> str:
    """Path of a command-line tool, looked up in this virtual environment first, then on PATH.

    A missing tool skips the test, except in CI (CI=true), where it fails it: CI installs every tool
    (docs/DEPLOY.md, "What was checked").
    """
    beside_python = Path(sys.executable).parent / name
    found = str(beside_python) if os.access(beside_python, os.X_OK) else shutil.which(name)
    if found is None:
        message = f"{name} is not installed (see docs/DEPLOY.md, 'What was checked')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_tool(name: str, *args: str, cwd: Path = REPO) -> str:
    """Run a tool (see require_tool) and return its output; a non-zero exit fails the test with that output."""
    result = subprocess.run(
        [require_tool(name), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{name} {' '.join(args)} exited with {result.returncode}:\n{output}"
    return output


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard, Grafana variables replaced (DASHBOARD_VARIABLES)."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in DASHBOARD_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a variable the tests do not know: {expr}"
            queries.append((panel["title"], expr))
    return queries


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the image test's measurements (tests/deploy/test_image.py), whatever the output options."""
    measured = [
        (name, value)
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", [])
        if name.startswith("image_")
    ]
    if measured:
        terminalreporter.write_sep("-", "attnserve image (test-artifacts/image/image.json)")
        for name, value in measured:
            terminalreporter.write_line(f"{name.removeprefix('image_')}: {value}")
