"""The builder's graphs against model/transformer.py on random models of every config (reference.CONFIGS), on a
bundle the builder wrote from numpy weights alone: each graph form's outputs within 1e-5 in float32 (float16's
within FLOAT16_TOLERANCE), the weights read back exactly, the int8 graphs derived from the fast ones, and greedy
and beam-4 decoding through the service's decoder on the exact, fast and device runners giving the PyTorch
runner's tokens, and on the exact runner its attention within 1e-5."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model.export.builder.graphs import fast_decoder
from model.export.builder.weights import read_weights
from model.export.builder.write import write_bundle
from model.export.check import (
    FLOAT16_TOLERANCE,
    check_device_decoder,
    check_fast_decoder,
    check_fast_encoder,
    check_forced_decoder,
    check_graphs,
)
from model.transformer import Transformer, greedy_decode
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.runner import DecoderRole, open_runner
from tests.bundles import tiny_spm
from tests.model.export.builder.reference import CONFIGS, TorchRunner, random_model

TOLERANCE = 1e-5
VOCAB = 380  # tests.bundles.tiny_spm's


@pytest.fixture(scope="module", params=CONFIGS)
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Transformer, Path]:
    """A random model of the config and its bundle, with both variants, written from its numpy state dict."""
    model = random_model(request.param, vocab_size=VOCAB)
    spm = tiny_spm(tmp_path_factory.mktemp("spm"))
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    out = tmp_path_factory.mktemp("bundle") / request.param
    write_bundle(model.config, weights, out, name=request.param, source_lang="en", target_lang="ja",
                 tokenizer={"source": spm, "target": spm}, variants=("int8", "float16"))  # fmt: skip
    return model, out


def test_every_form_matches_pytorch(built: tuple[Transformer, Path]) -> None:
    model, bundle = built
    assert check_graphs(model, bundle, TOLERANCE) <= TOLERANCE  # logits, presents, every attention
    assert check_fast_decoder(model, bundle / "decoder.fast.onnx", greedy=True, tolerance=TOLERANCE) <= TOLERANCE
    logits = bundle.parent / f"{bundle.name}.logits.onnx"  # every row's logits: what the int8 decoder quantizes
    onnx.save(fast_decoder(model.config, read_weights(bundle)[1], greedy=False), str(logits))
    assert check_fast_decoder(model, logits, greedy=False, tolerance=TOLERANCE) <= TOLERANCE
    assert check_fast_encoder(model, bundle / "encoder.fast.onnx", TOLERANCE) <= TOLERANCE
    assert check_forced_decoder(model, bundle / "decoder.forced.onnx", TOLERANCE) <= TOLERANCE
    assert check_device_decoder(model, bundle / "decoder.device.onnx", TOLERANCE) <= TOLERANCE
    float16 = ("encoder.float16.onnx", "decoder.float16.onnx")
    assert check_graphs(model, bundle, FLOAT16_TOLERANCE, float16) <= FLOAT16_TOLERANCE
    assert check_device_decoder(model, bundle / "decoder.device.float16.onnx", FLOAT16_TOLERANCE) <= FLOAT16_TOLERANCE
    assert (bundle / "encoder.int8.onnx").is_file() and (bundle / "decoder.int8.onnx").is_file()


def test_weights_read_back_exactly(built: tuple[Transformer, Path]) -> None:
    model, bundle = built
    config, weights = read_weights(bundle)
    assert config == model.config
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(weights[key], value.numpy(), err_msg=key)


def sources(model: Transformer) -> list[list[int]]:
    rng = np.random.default_rng(7)
    c = model.config
    return [[*rng.integers(2, c.vocab_size - 1, size=n).tolist(), c.eos_id] for n in (9, 5, 2, 7)]


ROLES: dict[str, DecoderRole] = {"exact": "decoder", "fast": "fast_decoder", "device": "device_decoder"}


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("form", ["exact", "fast", "device"])
def test_decoding_matches_pytorch(built: tuple[Transformer, Path], form: str, beam: int) -> None:
    """The service's decoder on the bundle's runner (exact: with every attention) and on the PyTorch runner: the
    same hypotheses, token for token; greedy, PyTorch's own greedy_decode's too."""
    model, bundle = built
    attention = form == "exact"
    runner = open_runner(load_bundle(bundle), "cpu", role=ROLES[form])
    requests = [DecodeRequest(src=s, beam_size=beam, n_best=beam, max_length=12, attention=attention)
                for s in sources(model)]  # fmt: skip
    got, want = decode(runner, requests), decode(TorchRunner(model), requests)
    for ours, theirs in zip(got, want, strict=True):
        assert [h.tokens for h in ours.hypotheses] == [h.tokens for h in theirs.hypotheses]
        if attention:
            np.testing.assert_allclose(ours.encoder_attention, theirs.encoder_attention, atol=TOLERANCE)  # type: ignore[arg-type]
            for a, b in zip(ours.hypotheses, theirs.hypotheses, strict=True):
                for kind in ("self_attention", "cross_attention"):
                    for step_a, step_b in zip(getattr(a, kind), getattr(b, kind), strict=True):  # (L, h, t + 1 or S)
                        np.testing.assert_allclose(step_a, step_b, atol=TOLERANCE)
    if beam == 1:
        srcs = sources(model)
        S = max(map(len, srcs))
        src = torch.tensor([s + [model.config.pad_id] * (S - len(s)) for s in srcs])
        reference = greedy_decode(model, src, (src != model.config.pad_id).long(), max_length=12).tolist()
        for result, tokens in zip(got, reference, strict=True):
            n = len(result.hypotheses[0].tokens)
            assert result.hypotheses[0].tokens == tokens[:n]


def test_builder_imports_no_torch() -> None:
    code = "import sys, model.export.builder.write; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
