"""A real uvicorn on loopback, serving a tiny random bundle, for the service tests."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from service.http.app import create_app
from service.settings import Settings


class Server:
    def __init__(self, settings: Settings) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        return self.start("/readyz")

    def start(self, probe: str) -> Server:
        """Run the server until ``probe`` answers 200: ``/readyz`` (ready), or ``/healthz`` (listening)."""
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + probe, timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not answer {probe}")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def client(self, timeout: float = 60, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, **kw)


ServerFactory = Callable[..., Server]


@pytest.fixture
def make_server(tiny_bundle: Path) -> Iterator[ServerFactory]:
    """Start servers with settings overrides; all are stopped after the test."""
    started: list[Server] = []

    def start(**overrides: Any) -> Server:
        server = Server(Settings(bundles=[tiny_bundle], **overrides)).__enter__()
        started.append(server)
        return server

    yield start
    for s in started:
        s.__exit__()


@pytest.fixture(scope="module")
def loading_server(tiny_bundle: Path) -> Iterator[Server]:
    """A server that listens while its models are still loading, for good: ``Models.start``
    (service/serving/models.py) never ends, so no engine is there yet and /readyz stays 503. Patched only while the
    lifespan calls it."""

    async def loading(*args: object) -> None:
        await asyncio.Event().wait()

    server = Server(Settings(bundles=[tiny_bundle]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("service.serving.models.Models.start", loading)
        server.start("/healthz")
    yield server
    server.__exit__()


def assert_loading(response: httpx.Response) -> None:
    """The answer of a request that needs the models (or the served languages) while they load."""
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1"
    assert response.json() == {"error": "the server is not ready (loading the models); retry shortly"}


@pytest.fixture(scope="module")
def server(tiny_bundle: Path) -> Iterator[Server]:
    """One server with the default settings, shared by a module's tests."""
    with Server(Settings(bundles=[tiny_bundle], max_wait_ms=20)) as s:
        yield s


@pytest.fixture(scope="session")
def argos_installation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A packages directory (tests/service/argos_installation.py: three packages and a broken one) and a cache
    that the one-shot ``attnserve import-argos --packages DIR --cache CACHE`` filled; skipped without the dev extra
    (torch and ctranslate2 build the packages)."""
    for module in ("torch", "ctranslate2"):
        pytest.importorskip(module, reason="the Argos packages are built with torch and CTranslate2 (the dev extra)")
    from tests.bundles import tiny_spm
    from tests.service.argos_installation import build_installation

    root = tmp_path_factory.mktemp("argos")
    packages = build_installation(root, tiny_spm(root / "spm"))
    cache = root / "cache"
    command = ["import-argos", "--packages", str(packages), "--cache", str(cache)]
    done = subprocess.run(
        [sys.executable, "-c", "from service.cli.main import main; exit(main())", *command],
        capture_output=True,
        text=True,
        timeout=900,
    )
    (root / "import.log").write_text(done.stderr)
    assert done.returncode == 0, done.stderr
    return packages, cache
