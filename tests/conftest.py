from __future__ import annotations

from pathlib import Path

import pytest

from tests.bundles import make_tiny_bundle


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random en→ja bundle (2+2 layers, 4 heads), built once per test session."""
    work = tmp_path_factory.mktemp("tiny-bundle")
    return make_tiny_bundle(work / "bundle", work)
