"""POST /detect and source "auto" on /translate and /attention, against real servers with tiny bundles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.runtime.manifest import Manifest
from tests.service.conftest import Server, ServerFactory, assert_loading

EN, DE, FR = "Delete the selected files?", "Die ausgewählten Dateien löschen?", "Supprimer les fichiers sélectionnés ?"


@pytest.fixture(scope="module")
def de_ja_bundle(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny bundle served as a de→ja pair (the manifest is outside the checksums)."""
    path = Path(shutil.copytree(tiny_bundle, tmp_path_factory.mktemp("de-ja") / "bundle"))
    manifest = Manifest.read(path)
    manifest.name, manifest.source_lang = "tiny-de-ja", "de"
    manifest.write(path)
    return path


def test_detect_one_text_gives_ranked_candidates(server: Server) -> None:
    with server.client() as c:
        r = c.post("/detect", data={"q": DE})  # libretranslatepy's form
        j = c.post("/detect", json={"q": FR})
    assert r.status_code == 200, r.text
    found = r.json()
    assert found[0]["language"] == "de" and found[0]["confidence"] > 90
    assert all(set(d) == {"confidence", "language"} and 1 <= d["confidence"] <= 100 for d in found)
    assert [d["confidence"] for d in found] == sorted((d["confidence"] for d in found), reverse=True)
    assert len(found) <= 3 and j.json()[0]["language"] == "fr"


def test_the_openapi_examples_work(server: Server) -> None:
    with server.client() as c:
        schema = c.get("/openapi.json").json()
        examples = schema["components"]["schemas"]["DetectRequest"]["examples"]
        assert examples and all(c.post("/detect", json=e).status_code == 200 for e in examples)
    body = schema["paths"]["/detect"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/DetectRequest"}


def test_detect_a_list_gives_a_list_per_text(server: Server) -> None:
    with server.client() as c:
        r = c.post("/detect", json={"q": [EN, DE, "ファイルを開く", " "]})
    assert r.status_code == 200, r.text
    assert [found[0]["language"] for found in r.json()] == ["en", "de", "ja", "en"]
    assert r.json()[3] == [{"confidence": 0.0, "language": "en"}]  # blank: the served source, no confidence


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [
        ({}, 422, "q"),
        ({"q": ""}, 422, "q"),
        ({"q": []}, 422, "q"),
        ({"q": ["x"] * 65}, 413, "max_texts"),
        ({"q": "x" * 5001}, 413, "max_chars"),
    ],
)
def test_detect_refusals_name_the_field(server: Server, body: dict[str, object], status: int, names: str) -> None:
    with server.client() as c:
        r = c.post("/detect", json=body)
    assert r.status_code == status and names in r.json()["error"], r.text


def test_detect_needs_a_key_when_the_server_has_keys(make_server: ServerFactory) -> None:
    server = make_server(api_keys=["k1"])
    with server.client() as c:
        assert c.post("/detect", json={"q": EN}).status_code == 403
        assert c.post("/detect", json={"q": EN, "api_key": "k1"}).status_code == 200


def test_auto_detects_each_text_and_routes_it_to_its_pair(tiny_bundle: Path, de_ja_bundle: Path) -> None:
    from service.settings import Settings

    with Server(Settings(bundles=[tiny_bundle, de_ja_bundle])) as server, server.client() as c:
        auto = c.post("/translate", json={"q": [EN, DE, EN], "source": "auto", "target": "ja"})
        one = c.post("/translate", json={"q": DE, "source": "auto", "target": "ja"})
        en = c.post("/translate", json={"q": [EN], "source": "en", "target": "ja"}).json()["translatedText"]
        de = c.post("/translate", json={"q": [DE], "source": "de", "target": "ja"}).json()["translatedText"]
        languages = c.get("/languages").json()
        attention = c.post("/attention", json={"q": DE, "target": "ja", "kinds": ["cross"]})
    assert auto.status_code == 200, auto.text
    assert auto.json()["translatedText"] == [en[0], de[0], en[0]]
    assert [d["language"] for d in auto.json()["detectedLanguage"]] == ["en", "de", "en"]
    assert all(50 < d["confidence"] <= 100 for d in auto.json()["detectedLanguage"])
    assert one.json()["detectedLanguage"]["language"] == "de"  # one text: one object
    assert attention.status_code == 200, attention.text  # two pairs into ja: "auto" is no longer ambiguous
    assert languages == [
        {"code": "de", "name": "German", "targets": ["ja"]},
        {"code": "en", "name": "English", "targets": ["ja"]},
        {"code": "ja", "name": "Japanese", "targets": []},
    ]


def test_auto_refuses_a_language_without_a_pair(server: Server) -> None:
    with server.client() as c:
        r = c.post("/translate", json={"q": [EN, FR], "source": "auto", "target": "ja"})
        a = c.post("/attention", json={"q": FR, "source": "auto", "target": "ja"})
        no_target = c.post("/translate", json={"q": EN, "source": "auto", "target": "de"})
    assert r.status_code == 400 and "q[1] was detected as 'fr'" in r.json()["error"], r.text
    assert "no model translates fr→ja" in r.json()["error"] and "set 'source'" in r.json()["error"]
    assert a.status_code == 400 and "detected as 'fr'" in a.json()["error"], a.text
    assert no_target.status_code == 400 and "into 'de'" in no_target.json()["error"]


def test_an_explicit_source_is_not_detected(server: Server) -> None:
    with server.client() as c:
        r = c.post("/translate", json={"q": FR, "source": "en", "target": "ja"})
    assert r.status_code == 200 and "detectedLanguage" not in r.json()


def test_a_blank_text_is_503_while_the_models_load(loading_server: Server) -> None:
    """A blank text answers the first served source, not known yet; other texts need only the detector."""
    with loading_server.client() as c:
        assert_loading(c.post("/detect", json={"q": " "}))
        assert_loading(c.post("/detect", json={"q": [EN, " "]}))
        r = c.post("/detect", json={"q": DE})
    assert r.status_code == 200 and r.json()[0]["language"] == "de", r.text
