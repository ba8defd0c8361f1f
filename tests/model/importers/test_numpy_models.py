"""tests/numpy_models.py's random models are what the real runtimes run, so that the torch-free tests that import
them (tests/service/serving/test_torch_free_import.py) import what users bring: the numpy-written Argos package,
imported, decodes CTranslate2's tokens (greedy and beam 4, exact and fast graphs), and the numpy-written OPUS-MT
directory passes the import's check against transformers' generate."""

from __future__ import annotations

from pathlib import Path

from model.importers.marian import import_marian
from service.cli.main import main
from tests.conftest import FIXTURES, TINY
from tests.model.importers.test_argos import assert_parity
from tests.numpy_models import argos_package, marian_directory

SPM = FIXTURES / TINY / "spm.model"


def test_the_numpy_argos_package_decodes_as_ctranslate2(tmp_path: Path) -> None:
    package = argos_package(tmp_path / "package", SPM, "en", "ja")
    assert main(["import-argos", str(package), str(tmp_path / "bundle")]) == 0
    assert_parity(package, tmp_path / "bundle", (False, True))


def test_the_numpy_opus_mt_directory_decodes_as_transformers(tmp_path: Path) -> None:
    import_marian(marian_directory(tmp_path / "opus-mt-en-ja", SPM), tmp_path / "bundle")  # checked
