"""Overload, deadlines, limits and bad input: a clear JSON 4xx/5xx (service/http/errors.py's table), never a 500,
and the server keeps serving."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.errors import ModelsBusy, PairUnavailable, PivotOnly
from service.http import errors
from service.metrics import Metrics
from tests.service.conftest import Server, ServerFactory

OK = {"q": "Open file", "source": "en", "target": "ja"}


def still_serving(server: Server) -> None:
    with server.client() as c:
        assert c.post("/translate", json=OK).status_code == 200


def test_queue_full_gives_503_with_retry_after(make_server: ServerFactory) -> None:
    server = make_server(queue_size=2, max_batch_size=1, max_wait_ms=0)
    body = {**OK, "q": "Delete the selected files?", "max_length": 120}  # random weights: no early </s>

    async def flood() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            return list(await asyncio.gather(*(c.post("/translate", json=body) for _ in range(24))))

    responses = asyncio.run(flood())
    statuses = [r.status_code for r in responses]
    assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}
    rejected = next(r for r in responses if r.status_code == 503)
    assert int(rejected.headers["Retry-After"]) >= 1
    assert "queue is full" in rejected.json()["error"]
    still_serving(server)


def test_missed_deadline_gives_504(make_server: ServerFactory) -> None:
    server = make_server(request_timeout_s=0.001, decode_rate=1e9, max_wait_ms=20)  # servable, but not in time
    with server.client() as c:
        r = c.post("/translate", json=OK)
    assert r.status_code == 504 and "deadline" in r.json()["error"]


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        ({"json": {**OK, "q": "a" * 5001}}, 413, "max_chars=5000"),
        ({"json": {**OK, "q": "word " * 300}}, 413, "max_tokens="),
        ({"json": {**OK, "q": ["x"] * 65}}, 413, "max_texts=64"),
        (
            {"content": b'{"q": "' + b"a" * 1_100_000 + b'"}', "headers": {"content-type": "application/json"}},
            413,
            "max_body_bytes",
        ),
        ({"json": {**OK, "beam_size": 9}}, 422, "max_beam_size=8"),
        ({"json": {**OK, "max_length": 10_000}}, 422, "max_length=256"),
        ({"json": {**OK, "format": "xml"}}, 422, "format"),
        ({"json": {**OK, "q": []}}, 422, "empty"),
        ({"json": {"source": "en", "target": "ja"}}, 422, "q"),
        ({"json": ["not", "an", "object"]}, 400, "JSON object"),
        ({"content": b"{bad json", "headers": {"content-type": "application/json"}}, 400, "malformed JSON"),
        ({"content": b"\xff\xfe", "headers": {"content-type": "application/json"}}, 400, "malformed JSON"),
        ({"data": {"q": "x", "source": "en", "target": "ja", "beam_size": "many"}}, 422, "beam_size"),
        (
            {
                "content": b"q=x&target=ja&alternatives=-1",
                "headers": {"content-type": "application/x-www-form-urlencoded"},
            },
            422,
            "alternatives",
        ),
        ({"content": b"--b\r\nbroken", "headers": {"content-type": "multipart/form-data; boundary=b"}}, 422, "q"),
        ({"json": {**OK, "target": "xx"}}, 400, "en→ja"),
    ],
)
def test_bad_input_is_a_clear_4xx(server: Server, kwargs: dict, status: int, needle: str) -> None:
    with server.client() as c:
        r = c.post("/translate", **kwargs)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]
    still_serving(server)


def test_unknown_route_and_method_are_json(server: Server) -> None:
    with server.client() as c:
        missing, wrong = c.get("/nope"), c.get("/translate")
    assert missing.status_code == 404 and "error" in missing.json()
    assert wrong.status_code == 405 and "error" in wrong.json()


def test_a_caller_gone_while_sending_its_body_is_no_server_error(make_server: ServerFactory) -> None:
    server = make_server()
    with socket.create_connection(("127.0.0.1", server.port)) as s:  # 6 of the 100 body bytes it announced
        s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b'Content-Length: 100\r\n\r\n{"q": ')

    def statuses() -> set[str]:
        with server.client() as c:
            lines = c.get("/metrics").text.splitlines()
        mine = [ln for ln in lines if ln.startswith('attnserve_requests_total{endpoint="translate"')]
        return {ln.split('status="')[1][:3] for ln in mine}

    for _ in range(100):
        if statuses():
            break
        time.sleep(0.05)
    assert statuses() == {"499"}
    still_serving(server)


@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (ModelsBusy("the model for en→de is not loaded"), 503, "models_busy"),
        (PairUnavailable("the model for en→de failed to load"), 503, None),
        (PivotOnly("ja→de is served through en"), 400, "invalid"),
    ],
)
def test_pair_errors_have_their_status(error: Exception, status: int, reason: str | None) -> None:
    """A pair that cannot be loaded now is a 503 to retry; /attention on a pivot pair is the caller's 400."""
    metrics = Metrics()
    app = FastAPI()
    errors.install(app, lambda: metrics)

    @app.post("/translate")
    async def translate() -> None:
        raise error

    with TestClient(app) as c:
        response = c.post("/translate")
    assert response.status_code == status
    assert response.json() == {"error": str(error)}
    assert ("Retry-After" in response.headers) == (status == 503)
    if reason is not None:
        assert metrics.rejected.labels(reason, "")._value.get() == 1
