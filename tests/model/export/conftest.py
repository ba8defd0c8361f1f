"""Fixtures of the export tests: a tiny tokenizer, and fast decoders with either attention kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model.export.build import export_fast_decoder
from model.export.examples import fast_example
from model.transformer import Transformer
from tests.bundles import tiny_model, tiny_spm


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_spm(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module", params=["attnserve", "onnxruntime"])
def fast_decoder(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Transformer, Path, dict[str, np.ndarray]]:
    """A tiny model, its exported fast decoder, with attnserve's attention kernels or ONNX Runtime's, and a feed."""
    model = tiny_model(365)
    path = tmp_path_factory.mktemp("fast") / "decoder.fast.onnx"
    export_fast_decoder(model, path, kernels=request.param)
    return model, path, fast_example(model, greedy=request.param == "attnserve")[0]
