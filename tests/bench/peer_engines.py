"""CTranslate2 comes with the ``dev`` extra: a test module of the peers calls :func:`need_ctranslate2` before it
imports them, and skips without it, except under CI=true, where every extra is installed."""

from __future__ import annotations

import os

import pytest


def need_ctranslate2() -> None:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("ctranslate2 is not installed (pip install -e '.[dev]')", allow_module_level=True)
