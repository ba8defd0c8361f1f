"""Tests of the forced decoder (model/export/graphs.py's ForcedDecoderGraph): its cross-attention equals PyTorch's
step by step, and adding it to a bundle keeps every other file's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model.export.build import export_forced_decoder
from model.export.bundle import FORCED, add_forced
from model.export.check import TOLERANCE, stepped_cross_attention
from model.export.examples import forced_example
from model.export.names import FORCED_OUTPUTS, forced_inputs
from model.export.store import WEIGHTS, store_weights_once
from service.runtime.bundle import load_bundle
from service.runtime.kernels import kernel_session
from service.runtime.manifest import MANIFEST, Manifest, sha256
from tests.bundles import make_tiny_bundle, tiny_model
from tests.model.export.shapes import CONFIGS


@pytest.mark.parametrize("name", CONFIGS)
def test_forced_cross_attention_equals_pytorch_stepping(name: str, tmp_path: Path) -> None:
    model = tiny_model(365, seed=2, **CONFIGS[name])
    path = tmp_path / FORCED
    assert export_forced_decoder(model, path) <= TOLERANCE
    # A row's positions do not depend on the padding after it: alone, its cross-attention is the same.
    feed, lengths = forced_example(model, seed=3)
    names = forced_inputs(model.config.n_decoder_layers)
    session = kernel_session(path)
    batch = session.run(FORCED_OUTPUTS, {k: feed[k] for k in names})[0]  # (L, B, h, T, S)
    b, n = 1, lengths[1]
    alone = {k: feed[k][b : b + 1, :n] if k in ("input_ids", "position_ids") else feed[k][b : b + 1] for k in names}
    np.testing.assert_allclose(session.run(FORCED_OUTPUTS, alone)[0][:, 0], batch[:, b, :, :n], atol=1e-6)
    want = stepped_cross_attention(model, feed)
    np.testing.assert_allclose(batch[:, 0], want[:, 0], atol=TOLERANCE)
    # The rows are probability distributions over the real source tokens.
    real = feed["encoder_attention_mask"][0] == 1
    np.testing.assert_allclose(batch[:, 0].sum(-1), 1.0, atol=1e-5)
    assert np.all(batch[:, 0][..., ~real] == 0)


def test_forced_graph_holds_no_weight_of_its_own(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "bundle", tmp_path / "work")
    manifest = Manifest.read(bundle)
    assert manifest.graphs["forced_decoder"] == FORCED
    assert manifest.graph_forms[FORCED] == {"role": "forced", "attentions": True}
    with_forced = (bundle / WEIGHTS).stat().st_size
    others = [g for g in manifest.graph_files if g != FORCED]
    assert store_weights_once(bundle, others) == with_forced
    graph = onnx.load(str(bundle / FORCED), load_external_data=False).graph
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and all(e.value == WEIGHTS for t in external for e in t.external_data if e.key == "location")


def test_add_forced_keeps_every_other_file(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "bundle", tmp_path / "work")
    manifest = Manifest.read(bundle)
    del manifest.graphs["forced_decoder"], manifest.graph_forms[FORCED]
    (bundle / FORCED).unlink()
    store_weights_once(bundle, manifest.graph_files)  # the bundle as an export without the forced decoder writes it
    manifest.write_with_checksums(bundle)
    assert not load_bundle(bundle).has_graph("forced_decoder")
    before = {p.name: sha256(p) for p in bundle.iterdir() if p.name != MANIFEST}

    add_forced(bundle)

    after = {p.name: sha256(p) for p in bundle.iterdir() if p.name != MANIFEST}
    assert {k: v for k, v in after.items() if k != FORCED} == before
    loaded = load_bundle(bundle)  # every sha256 verified
    assert loaded.has_graph("forced_decoder")
    assert loaded.form("forced_decoder").role == "forced"


def test_add_forced_refuses_a_weight_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = make_tiny_bundle(tmp_path / "bundle", tmp_path / "work")
    real = export_forced_decoder

    def with_extra_weight(model: torch.nn.Module, path: Path) -> float:
        worst = real(model, path)  # type: ignore[arg-type]
        graph = onnx.load(str(path))
        graph.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(512, dtype=np.float32), "extra"))
        onnx.save(graph, str(path))
        return worst

    monkeypatch.setattr("model.export.bundle.export_forced_decoder", with_extra_weight)
    with pytest.raises(ValueError, match="grew"):
        add_forced(bundle)
