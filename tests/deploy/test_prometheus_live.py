"""A real Prometheus scrapes a running attnserve under a short load; every dashboard query then returns data.

Everything listens on 127.0.0.1 on free ports; both processes are stopped when the test ends.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from service.runtime.manifest import Manifest

from .conftest import CUDA_ONLY, dashboard_queries, require_tool


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_for(what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what}: the process exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if ready():
                return
        except (httpx.TransportError, json.JSONDecodeError):  # not listening yet, or a starting server's text 503
            pass
        time.sleep(0.5)
    pytest.fail(f"{what}: not done after {timeout} s:\n{log.read_text()[-4000:]}")


def query(prometheus: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return list(answer["data"]["result"])


@pytest.fixture(scope="module")
def attnserve(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of `attnserve serve` on the tiny bundle, ready (GET /readyz is 200)."""
    exe = require_tool("attnserve")
    port, log = free_port(), tmp_path_factory.mktemp("attnserve") / "attnserve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    env |= {"ATTNSERVE_PROVIDER": "cpu", "ATTNSERVE_THREADS": "1"}
    args = [exe, "serve", "--bundle", str(tiny_bundle), "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with running(args, log, env) as process:
        wait_for("attnserve /readyz", lambda: httpx.get(f"{url}/readyz").status_code == 200, process, log, 120)
        yield url


@pytest.fixture(scope="module")
def prometheus(attnserve: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a Prometheus scraping attnserve every second, after its first successful scrape."""
    exe = require_tool("prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "attnserve", "static_configs": [{"targets": [attnserve.removeprefix("http://")]}]}
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port, log = free_port(), directory / "prometheus.log"
    args = [
        exe,
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}"
    with running(args, log) as process:
        wait_for("first scrape", lambda: query(url, 'up{job="attnserve"} == 1') != [], process, log, 60)
        yield url


def send_load(url: str, source: str, target: str) -> None:
    """40 translations (4 at a time), 5 attention requests and 3 bad requests; each must get its expected status."""
    with httpx.Client(base_url=url, timeout=60) as client:

        def post(path: str, body: dict) -> int:
            return client.post(path, json=body).status_code

        translate = [{"q": f"hello world number {i}", "source": source, "target": target} for i in range(40)]
        with ThreadPoolExecutor(max_workers=4) as pool:
            assert set(pool.map(lambda body: post("/translate", body), translate)) == {200}
        for _ in range(5):
            assert post("/attention", {"q": "hello world", "source": source, "target": target}) == 200
        assert 400 <= post("/translate", {}) < 500
        assert 400 <= post("/translate", {"q": "hello", "source": source, "target": "no-such-language"}) < 500
        assert client.get("/no-such-page").status_code == 404


@pytest.mark.timeout(300)
def test_every_dashboard_query_returns_data(attnserve: str, prometheus: str, tiny_bundle: Path) -> None:
    manifest = Manifest.read(tiny_bundle)
    send_load(attnserve, manifest.source_lang, manifest.target_lang)

    translated = 'sum(attnserve_requests_total{endpoint="translate", status="200"}) >= 40'
    deadline = time.monotonic() + 30
    while not query(prometheus, translated):
        assert time.monotonic() < deadline, "Prometheus did not see the 40 translations within 30 s"
        time.sleep(1)
    time.sleep(2)  # a few more scrapes, so every rate() window holds the load and what followed it

    on_cuda = [(title, expr) for title, expr in dashboard_queries() if any(name in expr for name in CUDA_ONLY)]
    on_cpu = [(title, expr) for title, expr in dashboard_queries() if (title, expr) not in on_cuda]
    assert {name for name in CUDA_ONLY if any(name in expr for _, expr in on_cuda)} == set(CUDA_ONLY)
    empty = [f"{title}: {expr}" for title, expr in on_cpu if not query(prometheus, expr)]
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)
    shown = [f"{title}: {expr}" for title, expr in on_cuda if query(prometheus, expr)]
    assert not shown, "CUDA-only panels with data from a server on the CPU:\n" + "\n".join(shown)

    # The dashboard shows every metric the service exports (a histogram or counter by any of its series).
    names = httpx.get(f"{prometheus}/api/v1/label/__name__/values", timeout=10).json()["data"]
    exprs = " ".join(expr for _, expr in dashboard_queries())
    exported = {re.sub(r"_(bucket|sum|count|created)$", "", n) for n in names}
    missing = sorted(n for n in exported if n.startswith("attnserve_") and n not in exprs)
    assert not missing, f"metrics the dashboard does not show: {missing}"
