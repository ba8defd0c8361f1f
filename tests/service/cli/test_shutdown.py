"""Graceful shutdown of a real ``attnserve serve`` process: on SIGTERM /readyz turns 503 at once, new requests get
503, every request accepted before it is answered in full, and the process exits within
``ATTNSERVE_SHUTDOWN_TIMEOUT_S``, answering 503 to what is left near the end rather than dropping it.

The timings go to test-artifacts/drain/drain.json (docs/DEPLOY.md, "Draining").
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.process import ServeProcess

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "drain"
timings: dict[str, Any] = {}  # the drain's measurements, written to test-artifacts/drain/drain.json


@pytest.fixture(scope="module", autouse=True)
def write_timings() -> Iterator[None]:
    yield
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "drain.json").write_text(json.dumps(timings, indent=2) + "\n")


# Forced decoding: a fixed number of decoder steps, each slowed down, so a request's time in flight is known.
FORCED = {"q": "Open the file", "source": "en", "target": "ja", "target_text": "ファイルを開いて設定を保存してください"}
FORCED_STEPS = 23  # the target text's tokens with </s>


def in_flight(server: ServeProcess) -> int:
    text = httpx.get(server.url + "/metrics", timeout=5).text
    found = re.findall(r"^attnserve_(?:active_sequences|queue_depth)\{[^}]*\} (\S+)$", text, re.M)
    return int(sum(float(v) for v in found))


def send_all(server: ServeProcess, n: int) -> tuple[list[Any], list[threading.Thread]]:
    """n concurrent forced /attention requests; each answer (or exception) lands in the list with its time."""
    answers: list[Any] = []

    def send() -> None:
        try:
            r = httpx.post(server.url + "/attention", json=FORCED | {"kinds": ["cross"]}, timeout=120)
            answers.append((time.monotonic(), r.status_code, r.headers, r.json()))
        except Exception as e:  # a dropped request is what the tests look for
            answers.append((time.monotonic(), None, None, repr(e)))

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while in_flight(server) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_flight(server) == n, "the requests did not all reach the scheduler"
    return answers, threads


def raw_request(port: int, body: bytes) -> socket.socket:
    """A connection that has sent a request's headers and half of its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) // 2])
    return sock


def read_response(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        if b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head, re.I)
            if length and len(rest) >= int(length[1]):
                return data
    return data


def test_sigterm_drains_requests_in_flight(tiny_bundle: Path, tmp_path: Path) -> None:
    n = 8
    with ServeProcess(tmp_path / "log", slow_step_s=0.08, bundles=tiny_bundle, shutdown_timeout_s=30) as server:
        server.wait_ready()
        idle = httpx.Client(base_url=server.url, timeout=30)  # a kept-alive connection, idle at the signal
        assert idle.get("/healthz").status_code == 200
        body = b'{"q": "Open file", "source": "en", "target": "ja"}'
        partial = raw_request(server.port, body)
        answers, threads = send_all(server, n)

        signalled = time.monotonic()
        server.terminate()
        while (ready := httpx.get(server.url + "/readyz", timeout=5)).status_code == 200:  # new connections
            assert time.monotonic() - signalled < 0.5, "/readyz still 200 after SIGTERM"
        timings["readyz_503_after_s"] = round(time.monotonic() - signalled, 3)
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "1", ready.text
        assert "shutting down" in ready.json()["error"]
        new = httpx.post(server.url + "/translate", json={"q": "Save", "target": "ja"}, timeout=5)
        assert new.status_code == 503 and new.headers["Retry-After"] == "1" and "shutting down" in new.json()["error"]
        assert new.headers["Connection"] == "close"
        again = idle.post("/translate", json={"q": "Save", "target": "ja"})
        assert again.status_code == 503, "a kept-alive connection gets no new work either"
        assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200  # alive while draining

        partial.sendall(body[len(body) // 2 :])  # accepted before the signal: its body may finish after it
        assert read_response(partial).startswith(b"HTTP/1.1 200 ")
        for t in threads:
            t.join(60)
        code = server.wait(30)
        exited = time.monotonic()

    assert code == 0
    assert [a[1] for a in answers] == [200] * n, answers
    for _, _, _, answer in answers:
        assert len(answer["target_tokens"]) == FORCED_STEPS and len(answer["cross"][0][0]) == FORCED_STEPS
    last = max(a[0] for a in answers)
    assert last - signalled > 0.5, "every request was answered before the signal: slow the steps down"
    assert exited - last < 3, "the process lingered after the last answer"
    timings.update(in_flight=n, last_answer_after_s=round(last - signalled, 2))
    timings["exit_after_s"] = round(exited - signalled, 2)
    assert exited - signalled < 30
    log = server.text()
    assert "Traceback" not in log and "ERROR" not in log, log
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/healthz", timeout=2)


def test_past_the_timeout_what_remains_gets_503(tiny_bundle: Path, tmp_path: Path) -> None:
    """Requests that would take 23 × 0.25 s get 503 + Retry-After before the 4 s timeout ends; none is dropped."""
    n, timeout = 4, 4.0
    with ServeProcess(tmp_path / "log", slow_step_s=0.25, bundles=tiny_bundle, shutdown_timeout_s=timeout) as server:
        server.wait_ready()
        answers, threads = send_all(server, n)
        signalled = time.monotonic()
        server.terminate()
        for t in threads:
            t.join(60)
        code = server.wait(30)
        exited = time.monotonic()

    assert code == 0
    assert [a[1] for a in answers] == [503] * n, answers
    for at, _, headers, answer in answers:
        assert headers["Retry-After"] == "1" and "shutting down" in answer["error"]
        assert at - signalled < timeout
    assert exited - signalled < timeout, f"exit {exited - signalled:.2f} s after SIGTERM"
    timings["past_timeout"] = {
        "shutdown_timeout_s": timeout,
        "last_503_after_s": round(max(a[0] for a in answers) - signalled, 2),
        "exit_after_s": round(exited - signalled, 2),
    }
    log = server.text()
    assert "Traceback" not in log and "ERROR" not in log, log
