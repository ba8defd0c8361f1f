"""GET /languages."""

from __future__ import annotations

from tests.service.conftest import Server, assert_loading


def test_languages_list_targets_too_in_libretranslate_shape(server: Server) -> None:
    with server.client() as c:
        assert c.get("/languages").json() == [
            {"code": "en", "name": "English", "targets": ["ja"]},
            {"code": "ja", "name": "Japanese", "targets": []},  # Weblate keeps only the codes listed here
        ]


def test_languages_are_503_while_the_models_load(loading_server: Server) -> None:
    with loading_server.client() as c:
        assert_loading(c.get("/languages"))
