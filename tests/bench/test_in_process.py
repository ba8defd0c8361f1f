"""bench/in_process.py: the service's engine started as the server starts it, loaded by callers in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from service.serving.engine import Engine
from service.serving.translation import Options
from service.settings import Settings
from tests.service.process import REPO

TEXTS = ["Open file", "Could not open %s: permission denied", "Settings", "The file {0} already exists."]


def test_callers_get_the_engines_own_translations(tiny_bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "setup.json").write_text(json.dumps({"bundle": str(tiny_bundle), "texts": TEXTS}))
    command = [sys.executable, "bench/in_process.py", "--work", str(tmp_path), "--seconds", "0.5", "--clients", "3"]
    env = {**os.environ, "ATTNSERVE_THREADS": "1", "ATTNSERVE_LOG_LEVEL": "warning"}
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["rate"] > 0
    engine = Engine.load(tiny_bundle, Settings(threads=1))
    expected = {str(i): engine.translate_now([text], Options())[0].text for i, text in enumerate(TEXTS)}
    assert result["outputs"] == expected  # every text answered in the first turns, as the engine answers it
