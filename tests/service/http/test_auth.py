"""API keys on /translate and /attention, the token on /metrics."""

from __future__ import annotations

from tests.service.conftest import ServerFactory

OK = {"q": "Open file", "source": "en", "target": "ja"}


def test_api_keys(make_server: ServerFactory) -> None:
    server = make_server(api_keys=["s3cret"])
    with server.client() as c:
        none = c.post("/translate", json=OK)
        wrong = c.post("/translate", json={**OK, "api_key": "nope"})
        bearer_wrong = c.post("/attention", json=OK, headers={"Authorization": "Bearer nope"})
        in_body = c.post("/translate", json={**OK, "api_key": "s3cret"})
        in_form = c.post("/translate", data={**OK, "api_key": "s3cret"})
        bearer = c.post("/attention", json=OK, headers={"Authorization": "Bearer s3cret"})
        health = c.get("/healthz"), c.get("/readyz"), c.get("/metrics")
    for r in (none, wrong, bearer_wrong):
        assert r.status_code == 403 and "API key" in r.json()["error"]
    assert [r.status_code for r in (in_body, in_form, bearer)] == [200, 200, 200]
    assert [r.status_code for r in health] == [200, 200, 200]


def test_metrics_token(make_server: ServerFactory) -> None:
    server = make_server(metrics_token="m-token")
    with server.client() as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 403
        assert c.get("/metrics", headers={"Authorization": "Bearer m-token"}).status_code == 200
