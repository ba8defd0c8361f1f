"""The README's curl examples work as written against a server of `make serve`'s default: every shipped bundle."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.settings import Settings
from tests.service.conftest import Server

README = Path(__file__).resolve().parents[2] / "README.md"


def curl_commands() -> list[str]:
    text = README.read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("curl ") and "127.0.0.1:8000" in line:
                commands.append(line)
    return commands


def test_readme_has_curl_examples() -> None:
    assert len(curl_commands()) >= 4


@pytest.fixture(scope="module")
def served() -> Iterator[Server]:
    with Server(Settings(max_wait_ms=20)) as server:
        yield server


@pytest.mark.parametrize("command", curl_commands())
def test_readme_curl_example(served: Server, command: str) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    command = command.replace("http://127.0.0.1:8000", served.url).replace("curl -s", "curl -s -w '\\n%{http_code}'")
    out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=True).stdout
    body, status = out.rsplit("\n", 1)
    assert status == "200", body
    data = json.loads(body)
    assert "error" not in data
