"""GET /languages."""

from __future__ import annotations

from tests.service.conftest import Server


def test_languages_list_targets_too_in_libretranslate_shape(server: Server) -> None:
    with server.client() as c:
        assert c.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["ja"]},
            {"code": "ja", "name": "Japanese", "targets": []},  # Weblate keeps only the codes listed here
        ]
