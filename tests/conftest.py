from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"  # written by ``python -m tests.bundles``
# A machine's own LibreTranslate packages are served by default (service/serving/packages.py); never in the tests.
os.environ["ARGOS_PACKAGES_DIR"] = str(FIXTURES / "no-argos-packages")
# The tests' random models loop: the tests compare their outputs as decoded (tests/service/serving/test_unlooping.py
# turns the guard on).
os.environ["ATTNSERVE_REPETITION_GUARD"] = "false"
TINY, TINY_INT8 = "tiny-en-ja", "tiny-en-ja-int8"


def _copy(name: str, factory: pytest.TempPathFactory) -> Path:
    return Path(shutil.copytree(FIXTURES / name, factory.mktemp(name) / "bundle"))


@pytest.fixture(scope="package")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random en→ja bundle (2+2 layers, 4 heads), copied once from tests/fixtures (no torch needed)."""
    return _copy(TINY, tmp_path_factory)


@pytest.fixture(scope="package")
def tiny_int8_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same bundle with its int8 variant."""
    return _copy(TINY_INT8, tmp_path_factory)
