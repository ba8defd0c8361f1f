"""service/http/access_log.py: an API key in the query string is logged as ``api_key=***``, by a real ``attnserve
serve`` too."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from service.http.access_log import HideKeys, redact
from tests.service.process import ServeProcess


@pytest.mark.parametrize(
    ("path", "logged"),
    [
        ("/translate?api_key=k1&q=Open%20file", "/translate?api_key=***&q=Open%20file"),
        ("/translate?q=a&api_key=k1", "/translate?q=a&api_key=***"),
        ("/detect?api%5Fkey=k1&api_key=k2", "/detect?api_key=***&api_key=***"),  # as body.py's parser reads names
        ("/translate?api_key=", "/translate?api_key=***"),
        ("/translate?my_api_key=k1&api_keys=k2&q=api_key=k3", "/translate?my_api_key=k1&api_keys=k2&q=api_key=k3"),
        ("/languages", "/languages"),
    ],
)
def test_redact_hides_every_api_key_value_only(path: str, logged: str) -> None:
    assert redact(path) == logged


def test_the_filter_rewrites_the_path_argument() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d', None, None)
    record.args = ("127.0.0.1:5000", "POST", "/translate?api_key=k1", "1.1", 200)
    assert HideKeys().filter(record)
    assert record.getMessage() == '127.0.0.1:5000 - "POST /translate?api_key=*** HTTP/1.1" 200'


def test_attnserve_serve_logs_no_key(tiny_bundle: Path, tmp_path: Path) -> None:
    with ServeProcess(tmp_path / "log", bundles=tiny_bundle, api_keys="k-secret") as server:
        server.wait_ready()
        query = "api_key=k-secret&q=Open%20file&source=en&target=ja"
        assert httpx.post(f"{server.url}/translate?{query}", timeout=30).status_code == 200  # deep-translator's form
        assert httpx.post(f"{server.url}/detect?api%5Fkey=k-secret&q=Datei", timeout=30).status_code == 200
        assert httpx.post(f"{server.url}/detect?api_key=k-wrong&q=Datei", timeout=30).status_code == 403
        server.terminate()
        assert server.wait() == 0
    log = server.text()
    assert '"POST /translate?api_key=***&q=Open%20file&source=en&target=ja HTTP/1.1" 200' in log
    assert '"POST /detect?api_key=***&q=Datei HTTP/1.1" 200' in log
    assert '"POST /detect?api_key=***&q=Datei HTTP/1.1" 403' in log
    assert "k-secret" not in log and "k-wrong" not in log
