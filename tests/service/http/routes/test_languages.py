"""GET /languages."""

from __future__ import annotations

from tests.service.conftest import Server


def test_languages_in_libretranslate_shape(server: Server) -> None:
    with server.client() as c:
        assert c.get("/languages").json() == [{"code": "en", "name": "English", "targets": ["ja"]}]
