"""Real LibreTranslate clients, unmodified, against a real uvicorn serving the tiny bundle: libretranslatepy,
deep-translator's LibreTranslator, Weblate's request shape (its LibreTranslate machinery's JSON batch) and
LibreTranslate's own frontend's (its fields, ``secret`` among them, pass the server's strict fields); and the
same clients against ``attnserve serve`` started with only a directory of Argos packages, on every pair.

The clients are in the ``test`` extra; without them these tests skip, except under CI=true where they fail.
"""

from __future__ import annotations

import importlib
import os
import re
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from tests.service.argos_installation import PACKAGES, reference_text
from tests.service.conftest import Server, ServerFactory
from tests.service.process import ServeProcess

TEXTS = ["Open file", "Delete the selected files?", "Settings"]
WEBLATE_TIMEOUT_S = 20  # Weblate's LibreTranslate machinery: request_timeout


def client(module: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        reason = f"this test needs the LibreTranslate client {package} (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def reference(server: Server, q: str | list[str], source: str = "en") -> object:
    with server.client() as c:
        r = c.post("/translate", json={"q": q, "source": source, "target": "ja"})
    assert r.status_code == 200, r.text
    return r.json()["translatedText"]


def test_libretranslatepy(server: Server) -> None:
    lt = client("libretranslatepy", "libretranslatepy").LibreTranslateAPI(server.url)
    assert lt.translate(TEXTS[1], "en", "ja") == reference(server, TEXTS[1])
    assert lt.translate("Save as…", "en", "ja") == reference(server, "Save as…")  # UTF-8 in a form body
    detected = lt.detect("Die ausgewählten Dateien löschen?")
    assert detected[0]["language"] == "de" and detected[0]["confidence"] > 50
    assert {"en", "ja"} <= {lang["code"] for lang in lt.languages()}


def test_libretranslatepy_with_an_api_key(make_server: ServerFactory) -> None:
    api = client("libretranslatepy", "libretranslatepy").LibreTranslateAPI
    server = make_server(api_keys=["k1"])
    assert api(server.url, api_key="k1").detect("Datei öffnen")[0]["language"] == "de"
    with pytest.raises(urllib.error.HTTPError) as refused:
        api(server.url, api_key="wrong").translate("Open file", "en", "ja")
    assert refused.value.code == 403


def test_deep_translator(server: Server) -> None:
    libre = client("deep_translator", "deep-translator")
    # deep-translator needs some key; this server has none configured, so any key passes
    translator = libre.LibreTranslator(source="en", target="ja", api_key="unused", custom_url=server.url + "/")
    assert translator.translate(TEXTS[1]) == reference(server, TEXTS[1])  # query-string fields, empty body
    assert translator.translate_batch(TEXTS) == reference(server, TEXTS)
    assert translator.translate("café") == reference(server, "café")


def weblate_texts() -> list[str]:
    """Twenty UI strings with Weblate's placeables markers, as its machinery replaces them before it asks."""
    templates = [
        "Open [X{0}X] in a new window",
        "[X{0}X] files selected",
        "Could not save [X{0}X]: [X{1}X]",
        "Delete [X{0}X]?",
        "Copied [X{0}X] of [X{1}X] items",
    ]
    return [templates[i % len(templates)].format(i, i + 1) for i in range(20)]


def markers(text: str) -> list[str]:
    return sorted(re.findall(r"\[X\d+X\]", text))


def weblate_batch(server: Server) -> tuple[list[str], list[str], float]:
    texts = weblate_texts()
    body = {"api_key": "", "q": texts, "source": "en", "target": "ja"}  # what Weblate posts, key unset
    start = time.monotonic()
    with server.client(timeout=WEBLATE_TIMEOUT_S) as c:
        r = c.post("/translate", json=body)
    elapsed = time.monotonic() - start
    assert r.status_code == 200, r.text
    return texts, r.json()["translatedText"], elapsed


def test_weblate_request_shape(server: Server) -> None:
    with server.client() as c:  # Weblate keeps the codes /languages lists and asks only for pairs between them
        codes = [lang["code"] for lang in c.get("/languages").json()]
    assert "en" in codes and "ja" in codes
    texts, translated, elapsed = weblate_batch(server)
    assert elapsed < WEBLATE_TIMEOUT_S
    assert isinstance(translated, list) and len(translated) == len(texts)
    assert all(isinstance(t, str) and t for t in translated)


def test_weblate_markers_are_kept(server: Server) -> None:
    texts, translated, _ = weblate_batch(server)
    assert [markers(t) for t in translated] == [markers(t) for t in texts]


# LibreTranslate's own web frontend (libretranslate/templates/app.js.template) posts FormData: its translation with
# the key's secret, which attnserve accepts and does not use, and its file upload likewise; its API example, JSON.
FRONTEND_SECRET = "c2VjcmV0"


def test_libretranslate_frontend_fields(server: Server) -> None:
    form = {"q": TEXTS[1], "source": "en", "target": "ja", "format": "text", "alternatives": "3", "api_key": ""}
    with server.client() as c:
        typed = c.post("/translate", data={**form, "secret": FRONTEND_SECRET}, files={})
        example = c.post("/translate", json={**form, "alternatives": 3})
        upload = c.post(
            "/translate_file",
            files={"file": ("a.txt", TEXTS[1].encode())},
            data={"source": "en", "target": "ja", "api_key": "", "secret": FRONTEND_SECRET},
        )
    assert typed.status_code == 200 and example.status_code == 200 and upload.status_code == 200, upload.text
    assert typed.json() == example.json()  # the secret changes nothing


# A server started with only ATTNSERVE_ARGOS_PACKAGES (and its cache): every package's pair, asked by each client,
# answers CTranslate2's own translation of the package (tests/service/argos_installation.py).


@pytest.fixture(scope="module")
def packages_server(argos_installation: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    packages, cache = argos_installation
    log = tmp_path_factory.mktemp("packages-server") / "serve.log"
    with ServeProcess(log, argos_packages=packages, argos_cache=cache, max_wait_ms=20) as server:
        yield server.wait_ready(timeout=300)


def package_reference(argos_installation: tuple[Path, Path], name: str, text: str) -> str:
    packages, cache = argos_installation
    (bundle,) = cache.glob(f"{name}-*/")
    return reference_text(packages / name, bundle, text)


PACKAGE_PAIRS = [(name, source, target) for name, (source, target, *_) in PACKAGES.items()]


def test_packages_alone_serve_every_pair(packages_server: Any) -> None:
    with httpx.Client(base_url=packages_server.url) as c:
        languages = {lang["code"]: set(lang["targets"]) for lang in c.get("/languages").json()}
        names = set(re.findall(r'attnserve_model_info\{name="([^"]+)"', c.get("/metrics").text))
    # ja→de through en; the broken package's en→fr is not served
    assert languages == {"en": {"ja", "de"}, "ja": {"en", "de"}, "de": set()}
    assert names == set(PACKAGES), "the packages alone: not the shipped bundle"


@pytest.mark.parametrize(("name", "source", "target"), PACKAGE_PAIRS)
def test_libretranslatepy_on_packages(
    packages_server: Any, argos_installation: tuple[Path, Path], name: str, source: str, target: str
) -> None:
    lt = client("libretranslatepy", "libretranslatepy").LibreTranslateAPI(packages_server.url)
    for text in TEXTS:
        assert lt.translate(text, source, target) == package_reference(argos_installation, name, text)
    assert {source, target} <= {lang["code"] for lang in lt.languages()}


@pytest.mark.parametrize(("name", "source", "target"), PACKAGE_PAIRS)
def test_deep_translator_on_packages(
    packages_server: Any, argos_installation: tuple[Path, Path], name: str, source: str, target: str
) -> None:
    libre = client("deep_translator", "deep-translator")
    translator = libre.LibreTranslator(
        source=source, target=target, api_key="unused", custom_url=packages_server.url + "/"
    )
    want = [package_reference(argos_installation, name, t) for t in TEXTS]
    assert translator.translate(TEXTS[1]) == want[1]
    assert translator.translate_batch(TEXTS) == want


@pytest.mark.parametrize(("name", "source", "target"), PACKAGE_PAIRS)
def test_weblate_request_shape_on_packages(packages_server: Any, name: str, source: str, target: str) -> None:
    texts = weblate_texts()
    body = {"api_key": "", "q": texts, "source": source, "target": target}
    with httpx.Client(base_url=packages_server.url, timeout=WEBLATE_TIMEOUT_S) as c:
        r = c.post("/translate", json=body)
    assert r.status_code == 200, r.text
    translated = r.json()["translatedText"]
    assert [markers(t) for t in translated] == [markers(t) for t in texts]
