"""API keys on every endpoint they guard (/translate, /attention, /detect, /translate_file), none on the others;
the token on /metrics."""

from __future__ import annotations

from typing import Any

from tests.service.conftest import ServerFactory

OK = {"q": "Open file", "source": "en", "target": "ja"}
# Each guarded endpoint's request, and where it carries a key of its own (a JSON body, or form fields).
GUARDED: dict[str, tuple[dict[str, Any], str]] = {
    "/translate": ({"json": OK}, "json"),
    "/attention": ({"json": OK}, "json"),
    "/detect": ({"json": {"q": "Open file"}}, "json"),
    "/translate_file": ({"files": {"file": ("a.txt", b"Open file")}, "data": {"target": "ja"}}, "data"),
}
OPEN = ("/languages", "/frontend/settings", "/healthz", "/readyz", "/metrics")


def test_api_keys_guard_every_endpoint_that_translates_or_detects(make_server: ServerFactory) -> None:
    server = make_server(api_keys=["s3cret"])

    def post(path: str, key: str | None = None, bearer: str | None = None) -> int:
        request, fields = GUARDED[path]
        sent = {**request, fields: {**request[fields], "api_key": key}} if key else request
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        r = c.post(path, **sent, headers=headers)
        assert r.status_code != 403 or "API key" in r.json()["error"]
        return r.status_code

    with server.client() as c:
        for path in GUARDED:
            assert [post(path), post(path, "nope"), post(path, bearer="nope")] == [403, 403, 403], path
            assert [post(path, "s3cret"), post(path, bearer="s3cret")] == [200, 200], path
        assert [c.get(p).status_code for p in OPEN] == [200] * len(OPEN)


def test_a_form_carries_the_key(make_server: ServerFactory) -> None:
    with make_server(api_keys=["s3cret"]).client() as c:
        assert c.post("/translate", data={**OK, "api_key": "s3cret"}).status_code == 200
        assert c.post("/translate", data=OK).status_code == 403


def test_metrics_token(make_server: ServerFactory) -> None:
    server = make_server(metrics_token="m-token")
    with server.client() as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
        assert c.get("/metrics", headers={"Authorization": "Bearer m-token"}).status_code == 200
