"""The service-only install (make test-service: no torch, no transformers, no CTranslate2) imports what users bring
and serves it: an Argos package in ATTNSERVE_ARGOS_PACKAGES, imported by the server itself, and an OPUS-MT directory
of safetensors through ``attnserve import-marian``. Both are random models in the real layouts, written with numpy
(tests/numpy_models.py; tests/model/importers/test_numpy_models.py holds them to CTranslate2 and transformers)."""

from __future__ import annotations

from pathlib import Path

from service.cli.main import main
from service.settings import Settings
from tests.conftest import FIXTURES, TINY
from tests.numpy_models import argos_package, marian_directory
from tests.service.conftest import Server

SPM = FIXTURES / TINY / "spm.model"


def test_an_argos_package_and_an_opus_mt_directory_are_imported_and_served(tmp_path: Path) -> None:
    packages, cache = tmp_path / "packages", tmp_path / "cache"
    argos_package(packages / "translate-en_ja-1_0", SPM, "en", "ja")
    opus = marian_directory(tmp_path / "opus-mt-en-de", SPM, codes=("en", "de"))
    assert main(["import-marian", str(opus), str(tmp_path / "en-de")]) == 0
    settings = Settings(bundles=[tmp_path / "en-de"], argos_packages=packages, argos_cache=cache)
    with Server(settings) as server, server.client() as client:
        for target in ("ja", "de"):
            response = client.post("/translate", json={"q": "Open file", "source": "en", "target": target})
            assert response.status_code == 200, response.text
            assert isinstance(response.json()["translatedText"], str)
        languages = {(lang["code"], t) for lang in client.get("/languages").json() for t in lang["targets"]}
        assert {("en", "ja"), ("en", "de")} <= languages
    assert len(list(cache.glob("translate-en_ja-1_0-*/manifest.json"))) == 1  # imported by the server, cached
