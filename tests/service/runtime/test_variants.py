"""An int8 bundle variant serves /translate; /attention keeps the exact float32 weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime.bundle import BundleError
from service.serving.engine import Engine
from service.settings import Settings
from tests.service.conftest import Server

BODY = {"q": "Delete the selected files?", "source": "en", "target": "ja", "max_length": 8}


def test_int8_translates_and_attention_stays_exact(tiny_int8_bundle: Path) -> None:
    bundle = tiny_int8_bundle
    fast, exact = Server(Settings(bundles=[bundle], graph_variant="int8")), Server(Settings(bundles=[bundle]))
    with fast, exact, fast.client() as c, exact.client() as e:
        assert c.post("/translate", json=BODY).status_code == 200
        assert c.post("/attention", json=BODY).json() == e.post("/attention", json=BODY).json()
        # int8's fused decoder has no attention outputs: details come from the exact graphs
        details = {**BODY, "return_details": True}
        assert c.post("/translate", json=details).json() == e.post("/translate", json=details).json()


def test_missing_variant_is_a_clear_error(tiny_bundle: Path) -> None:
    with pytest.raises(BundleError, match="no 'int8' graphs"):
        Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle], graph_variant="int8"))
