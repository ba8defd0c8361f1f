"""The builder's graphs (:mod:`model.export.builder`) of a PyTorch model, each checked against it after it is
written: what ``attnserve export`` and the variants run where torch is, and what the tests hold equal."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from model.export.builder.graphs import decoder, device_decoder, encoder, fast_decoder, fast_encoder, forced_decoder
from model.export.builder.weights import Weights
from model.export.builder.write import logits_decoder
from model.export.check import (
    FLOAT16_TOLERANCE,
    TOLERANCE,
    check_device_decoder,
    check_fast_decoder,
    check_fast_encoder,
    check_forced_decoder,
)
from model.transformer import Transformer
from service.runtime.kernels import Kernels


def state_weights(model: Transformer) -> Weights:
    """The model's state dict as the builder takes it (numpy, float32)."""
    return {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}


def export_graphs(model: Transformer, out_dir: Path) -> None:
    """Write encoder.onnx and decoder.onnx (every attention an output)."""
    w = state_weights(model)
    onnx.save(encoder(model.config, w), str(out_dir / "encoder.onnx"))
    onnx.save(decoder(model.config, w), str(out_dir / "decoder.onnx"))


def export_fast_decoder(
    model: Transformer, path: Path, tolerance: float = TOLERANCE, kernels: Kernels = "attnserve"
) -> float:
    """Write the fast decoder with fused attention to ``path`` and check it (run as the runner runs it, its caches
    bound as input and output) against PyTorch's exact step on the same tokens: logits, and each row's cache slots,
    within ``tolerance``, and greedy tokens whose logits are the largest within it. Returns the largest difference.

    With attnserve's kernels it is the greedy form (logits or tokens by row); ONNX Runtime's form (what the int8
    variant's quantizer loads, which cannot hold attnserve's kernels) gives every row's logits."""
    greedy = kernels == "attnserve"
    w = state_weights(model)
    graph = fast_decoder(model.config, w) if greedy else logits_decoder(model.config, w)
    onnx.save(graph, str(path))
    return check_fast_decoder(model.eval(), path, greedy, tolerance)


def export_fast_encoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Write the fast encoder to ``path`` and check its cross keys and values against PyTorch's exact encoder.
    Returns the largest difference seen."""
    onnx.save(fast_encoder(model.config, state_weights(model)), str(path))
    return check_fast_encoder(model.eval(), path, tolerance)


def export_forced_decoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Write the forced decoder to ``path`` and check its cross-attention against PyTorch stepping through the same
    tokens, on rows of different target lengths, within ``tolerance``. Returns the largest difference."""
    onnx.save(forced_decoder(model.config, state_weights(model)), str(path))
    return check_forced_decoder(model.eval(), path, tolerance)


def export_device_decoder(model: Transformer, path: Path, float16: bool = False) -> float:
    """Write the device decoder with its selection tail to ``path`` and check it against PyTorch's exact step
    (:func:`~model.export.check.check_device_decoder`). Returns the largest difference seen.

    ``float16``: weights, arithmetic, caches and cache inputs and outputs in float16, the selection tail in float32;
    checked within FLOAT16_TOLERANCE instead of TOLERANCE."""
    graph = device_decoder(model.config, state_weights(model), float16=float16)
    onnx.checker.check_model(graph)
    onnx.save(graph, str(path))
    with torch.no_grad():
        return check_device_decoder(model.eval(), path, FLOAT16_TOLERANCE if float16 else TOLERANCE)
