"""The README's curl examples work as written against a server of `make serve`'s default: every shipped bundle; and
its "Coming from LibreTranslate" command, as written, imports and serves an Argos package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.settings import Settings
from tests.conftest import FIXTURES, TINY
from tests.numpy_models import argos_package
from tests.service.conftest import Server
from tests.service.process import free_port

TEXTS = ["Open file", "Delete the selected files?", "Settings"]
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


def libretranslate_command() -> str:
    """The README's "Coming from LibreTranslate" command."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    (command,) = [line for b in blocks for line in b.splitlines() if line.startswith("ATTNSERVE_ARGOS_PACKAGES=")]
    return command


def test_readme_libretranslate_path_imports_and_serves_the_packages(tmp_path: Path) -> None:
    # As written, in this venv (make test-service's has no torch): HOME holds a package where argos-translate keeps
    # them (tests/numpy_models.py) and the default cache; only the venv's path and the port (5000 may be taken) differ.
    lt = pytest.importorskip("libretranslatepy", reason="the LibreTranslate client is in the test extra")
    name = "translate-en_ja-1_0"
    argos_package(tmp_path / ".local/share/argos-translate/packages" / name, FIXTURES / TINY / "spm.model", "en", "ja")
    port, attnserve = free_port(), str(Path(sys.executable).parent / "attnserve")
    command = libretranslate_command()
    assert " .venv/bin/attnserve serve --port 5000" in command
    command = command.replace(".venv/bin/attnserve", attnserve).replace("--port 5000", f"--port {port}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSERVE_", "XDG_", "ARGOS_"))}
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            ["bash", "-c", command], cwd=tmp_path, env=env | {"HOME": str(tmp_path)}, stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while not ready(url):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        client = lt.LibreTranslateAPI(url + "/")
        served = [client.translate(text, "en", "ja") for text in TEXTS]
        assert [lang["code"] for lang in client.languages()] == ["en", "ja"], "the package alone"
    finally:
        server.terminate()
        server.wait(60)
    assert f"argos package {name}: importing" in log.read_text()
    (bundle,) = (tmp_path / ".cache/attnserve/argos").glob(f"{name}-*/")
    local = subprocess.run([attnserve, "translate", "--json", "--bundle", str(bundle), *TEXTS], capture_output=True,
                           text=True, check=True, env=env)  # fmt: skip
    assert served == json.loads(local.stdout), "the server's answers, as the bundle it imported gives them"


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
