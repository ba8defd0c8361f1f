"""Schema fuzzing: schemathesis runs every operation of a live ``attnserve serve``'s /openapi.json through its
examples, coverage and fuzzing phases. No answer may be a server error, and answers must match the schema's
status codes, content types and bodies; the server logs no traceback.

Budget: 200 fuzzed cases per operation, one worker, a fixed seed (reproducible; change it to explore), about
730 requests in 10-20 s on two cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.service.process import ServeProcess

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
PHASES = ("examples", "coverage", "fuzzing")
MAX_EXAMPLES, SEED = 200, 1


def test_schemathesis_finds_no_server_error(tiny_bundle: Path, tmp_path: Path) -> None:
    report = tmp_path / "schemathesis.json"
    with ServeProcess(tmp_path / "log", bundles=tiny_bundle, max_wait_ms=1) as server:
        server.wait_ready()
        options = {
            "--phases": ",".join(PHASES),
            "--checks": CHECKS,
            "--max-examples": str(MAX_EXAMPLES),
            "--seed": str(SEED),
            "--workers": "1",
            "--generation-database": "none",
            "--report": "json",
            "--report-json-path": str(report),
        }
        run = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run", f"{server.url}/openapi.json", "--no-color"]
            + [part for pair in options.items() for part in pair],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,  # its cache of crashes, outside the repository
        )
        log = server.text()
    result = json.loads(report.read_text())
    assert run.returncode == 0 and result["complete"] and not result["failures"] and not result["errors"], run.stdout
    assert {p: result["phases"][p]["status"] for p in PHASES} == dict.fromkeys(PHASES, "success")
    operations = result["operations"]
    assert operations["tested"] == operations["total"] >= 5  # /translate, /attention, /languages, /healthz, /readyz
    assert result["test_cases"]["generated"] >= 500
    assert {"POST /translate", "POST /attention"} <= set(result["valid_rates"])
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
