"""Tests of model/export/bundle.py: bundles of random models of several shapes through the service's decoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto

from model.cli import main
from model.export.bundle import export_bundle, round_to_float16
from model.export.check import check_graphs
from model.export.weights import load_state_dict
from model.transformer import greedy_decode
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.manifest import MANIFEST, Manifest
from service.runtime.runner import open_runner
from tests.bundles import tiny_model, write_fixtures
from tests.conftest import FIXTURES, TINY, TINY_INT8
from tests.model.export.shapes import CONFIGS, sources


@pytest.mark.parametrize("name", CONFIGS)
def test_onnx_matches_pytorch(name: str, spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365, seed=1, **CONFIGS[name])
    bundle_dir = export_bundle(
        model, tmp_path / name, name=name, source_lang="en", target_lang="ja", tokenizer={"source": spm, "target": spm}
    )
    # Logits, present keys/values and all three attention kinds, over a padded batch with a partly masked cache.
    assert check_graphs(model, bundle_dir, tolerance=1e-4) <= 1e-4

    # Greedy decoding through the step graph (the service's decoder) gives PyTorch's tokens, and the attention
    # rows it collected step by step equal a teacher-forced pass.
    runner = open_runner(load_bundle(bundle_dir), "cpu")
    srcs = sources(model)
    results = decode(runner, [DecodeRequest(src=s, max_length=12, attention=True) for s in srcs])
    S = max(map(len, srcs))
    src = torch.tensor([s + [model.config.pad_id] * (S - len(s)) for s in srcs])
    expected = greedy_decode(model, src, (src != model.config.pad_id).long(), max_length=12).tolist()
    for s, result, want in zip(srcs, results, expected, strict=True):
        hyp = result.hypotheses[0]
        n = len(hyp.tokens)
        assert hyp.tokens == want[:n]
        assert all(t == model.config.pad_id for t in want[n:])
        x = torch.tensor([s])
        tgt = torch.tensor([[model.config.decoder_start_id, *hyp.tokens[:-1]]])
        with torch.no_grad():
            memory, enc_w = model.encode(x, torch.ones_like(x)[:, None, None].bool())
            mask = torch.ones_like(x)[:, None, None].bool()
            causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
            _, _, self_w, cross_w = model.decode(tgt, torch.arange(n)[None], model.memory_kv(memory), mask, causal)
        np.testing.assert_allclose(result.encoder_attention, torch.stack(enc_w)[:, 0].numpy(), atol=1e-4)
        for t in range(n):
            np.testing.assert_allclose(hyp.cross_attention[t], torch.stack(cross_w)[:, 0, :, t].numpy(), atol=1e-4)
            np.testing.assert_allclose(
                hyp.self_attention[t], torch.stack(self_w)[:, 0, :, t, : t + 1].numpy(), atol=1e-4
            )

    # The weights read back exactly.
    config, state = load_state_dict(bundle_dir)
    assert config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key


def test_export_refuses_to_overwrite(spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365)
    kwargs = {"name": "x", "source_lang": "en", "target_lang": "ja", "tokenizer": {"source": spm, "target": spm}}
    export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(FileExistsError):
        export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    export_bundle(model, tmp_path / "b", force=True, **kwargs)  # type: ignore[arg-type]
    (tmp_path / "made").mkdir()
    assert (tmp_path / "b").stat().st_mode == (tmp_path / "made").stat().st_mode  # not a temporary directory's 0700
    manifest = Manifest.read(tmp_path / "b")
    assert set(manifest.sha256) == {"encoder.onnx", "decoder.onnx", "decoder.fast.onnx", "decoder.forced.onnx",
                                       "decoder.device.onnx", "spm.model", "weights.bin"}  # fmt: skip
    assert manifest.format == "attnserve-bundle/5"


def test_the_committed_tiny_bundles_are_what_the_exporter_writes(tmp_path: Path) -> None:
    write_fixtures(tmp_path / "out", tmp_path / "work")
    for name in (TINY, TINY_INT8):
        got, want = (Manifest.read(d / name).data for d in (tmp_path / "out", FIXTURES))
        for manifest in (got, want):
            del manifest["provenance"]["exported"]
        # sha256 covers every graph and the tokenizer, so equal manifests mean equal files
        assert got == want, f"tests/fixtures/{name} is out of date: python -m tests.bundles"
        derived = set(want.get("derived", {}))  # written on first load, never committed (.gitignore)
        shipped = {p.name for p in (FIXTURES / name).iterdir()} - derived
        assert shipped == {MANIFEST, *want["sha256"]} - derived


def test_export_checkpoint_stores_float16(spm: Path, tmp_path: Path) -> None:
    """``attnserve export CHECKPOINT OUT --store float16``: every weight rounded to float16 and stored so, half the
    weights file, the variants added from the float16-stored graphs."""
    model = tiny_model(365)
    meta = {"name": "x", "source_lang": "en", "target_lang": "ja", "spm": str(spm)}
    torch.save({"config": model.config.to_dict(), "model": model.state_dict(), "meta": meta}, tmp_path / "c.pt")
    for store in ("float32", "float16"):
        assert main(["export", str(tmp_path / "c.pt"), str(tmp_path / store), "--store", store, "--int8"]) == 0
    graph = onnx.load(str(tmp_path / "float16" / "decoder.onnx"), load_external_data=False).graph
    assert {t.data_type for t in graph.initializer if t.data_location == TensorProto.EXTERNAL} == {TensorProto.FLOAT16}
    sizes = [(tmp_path / store / "weights.bin").stat().st_size for store in ("float32", "float16")]
    assert 0.45 * sizes[0] < sizes[1] < 0.6 * sizes[0]
    _, state = load_state_dict(tmp_path / "float16")
    for key, value in round_to_float16(model).state_dict().items():
        assert torch.equal(state[key], value), key
    assert load_bundle(tmp_path / "float16").variants == ["float32", "int8"]
    assert main(["export", str(tmp_path / "c.pt"), str(tmp_path / "gpu"), "--store", "float16", "--float16"]) == 0
    assert load_bundle(tmp_path / "gpu").variants == ["float32", "float16"]  # the GPU variant of float16 weights


def test_round_to_float16_refuses_a_weight_beyond_its_range() -> None:
    model = tiny_model(365)
    with torch.no_grad():
        model.generator.proj.weight[0, 0] = 1e6
    with pytest.raises(ValueError, match="beyond float16's range"):
        round_to_float16(model)
