"""GET /frontend/settings and POST /suggest, as LibreTranslate answers them."""

from __future__ import annotations

from tests.service.conftest import Server, ServerFactory, assert_loading


def test_frontend_settings(server: Server) -> None:
    with server.client() as c:
        r = c.get("/frontend/settings")
    assert r.status_code == 200
    assert r.json() == {
        "charLimit": 5000,
        "frontendTimeout": 500,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".html", ".po", ".pot", ".txt"],
        "language": {"source": {"code": "auto", "name": "Auto Detect"}, "target": {"code": "ja", "name": "Japanese"}},
    }


def test_frontend_settings_follow_the_settings(make_server: ServerFactory) -> None:
    server = make_server(api_keys=["k"], max_chars=100, frontend_timeout_ms=900)
    with server.client() as c:
        r = c.get("/frontend/settings").json()
    assert (r["charLimit"], r["frontendTimeout"], r["apiKeys"], r["keyRequired"]) == (100, 900, True, True)


def test_suggest_is_off(server: Server) -> None:
    with server.client() as c:
        r = c.post("/suggest", data={"q": "Hello", "s": "こんにちは", "source": "en", "target": "ja"})
        g = c.get("/suggest")
    assert r.status_code == 403 and r.json() == {"error": "Suggestions are disabled on this server."}
    assert g.status_code == 405


def test_frontend_settings_are_503_while_the_models_load(loading_server: Server) -> None:
    with loading_server.client() as c:
        assert_loading(c.get("/frontend/settings"))
