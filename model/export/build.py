"""torch.onnx export of the graph modules, each checked against PyTorch after it is written."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from model.export.check import (
    FLOAT16_TOLERANCE,
    TOLERANCE,
    check_device_decoder,
    check_fast_decoder,
    check_forced_decoder,
    compare,
)
from model.export.examples import device_example, example_inputs, fast_example, forced_example, step_example
from model.export.graphs import (
    DecoderGraph,
    DeviceDecoderGraph,
    EncoderGraph,
    FastDecoderGraph,
    FastEncoderGraph,
    ForcedDecoderGraph,
)
from model.export.kernels import KERNELS, Kernels, attention_kernels, kernel_session
from model.export.names import (
    ENCODER_INPUTS,
    FORCED_OUTPUTS,
    decoder_inputs,
    decoder_outputs,
    device_decoder_axes,
    device_decoder_inputs,
    device_decoder_outputs,
    encoder_axes,
    encoder_outputs,
    fast_decoder_axes,
    forced_axes,
    forced_inputs,
    step_axes,
)
from model.export.selection import append_selection
from model.transformer import Transformer

OPSET = 17


def export_module(module: nn.Module, args: tuple[Tensor, ...], path: Path, names: tuple[list[str], list[str]],
            axes: dict[str, dict[int, str]], **extra: Any) -> None:  # fmt: skip
    """TorchScript's exporter (dynamo=False, opset 17), weights as named initializers (no constant folding).

    Why that exporter: it traces the Python control flow away (L layers unrolled), keeps parameter names as
    initializer names, and handles the dynamic batch, source and cache lengths; a zero-length cache works.
    """
    module.eval()  # the exporter restores the wrapper's mode afterwards: a new wrapper would put the model in training
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript exporter deprecation and tracer warnings
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=False,
            dynamo=False,
            **extra,
        )


def export_graphs(model: Transformer, out_dir: Path) -> None:
    """Export encoder.onnx and decoder.onnx (every attention an output)."""
    model = model.eval()
    L = model.config.n_decoder_layers
    enc_feed, dec_feed = step_example(model)
    B, S = "batch", "source_length"
    export_module(
        EncoderGraph(model),
        tuple(torch.from_numpy(enc_feed[k]) for k in ENCODER_INPUTS),
        out_dir / "encoder.onnx",
        (ENCODER_INPUTS, encoder_outputs(L)),
        encoder_axes(L),
    )
    export_module(
        DecoderGraph(model),
        tuple(torch.from_numpy(dec_feed[k]) for k in decoder_inputs(L)),
        out_dir / "decoder.onnx",
        (decoder_inputs(L), decoder_outputs(L)),
        {**step_axes(L), "self_attentions": {1: B, 3: "total_length"}, "cross_attentions": {1: B, 3: S}},
    )


def export_fast_decoder(
    model: Transformer, path: Path, tolerance: float = TOLERANCE, kernels: Kernels = "attnserve"
) -> float:
    """Export :class:`FastDecoderGraph` with fused attention (``kernels``: :func:`attention_kernels`) to ``path`` and
    check it (run as the runner runs it, its caches bound as input and output) against PyTorch's exact step on the
    same tokens: logits, and each row's cache slots, within ``tolerance``, and greedy tokens whose logits are the
    largest within it. Returns the largest difference seen.

    With attnserve's kernels it is the greedy form (``greedy``: logits or tokens by row); ONNX Runtime's form (what
    the int8 variant's quantizer loads, which cannot hold attnserve's kernels) gives every row's logits."""
    model = model.eval()
    L = model.config.n_decoder_layers
    greedy = kernels == "attnserve"
    names, outputs = decoder_inputs(L, fast=True, greedy=greedy), decoder_outputs(L, fast=True, greedy=greedy)
    feed, _ = fast_example(model, greedy=greedy)
    export_module(
        FastDecoderGraph(model, greedy),
        tuple(torch.from_numpy(feed[k]) for k in names),
        path,
        (names, outputs),
        fast_decoder_axes(L, greedy),
        custom_opsets={KERNELS: 1},
    )
    attention_kernels(path, model.config.h, kernels)
    return check_fast_decoder(model, path, greedy, tolerance)


def export_fast_encoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Export :class:`FastEncoderGraph` to ``path`` and check its cross keys and values against PyTorch's exact
    encoder (:class:`EncoderGraph`) on a padded batch with two texts packed in a row, within ``tolerance``.
    Returns the largest difference seen."""
    model = model.eval()
    L = model.config.n_decoder_layers
    feed = example_inputs(model.config)["encoder"]
    outputs = encoder_outputs(L, fast=True)
    export_module(
        FastEncoderGraph(model),
        tuple(torch.from_numpy(feed[k]) for k in ENCODER_INPUTS),
        path,
        (ENCODER_INPUTS, outputs),
        {k: v for k, v in encoder_axes(L).items() if k in ENCODER_INPUTS + outputs},
        custom_opsets={KERNELS: 1},
    )
    feed = example_inputs(model.config, seed=1)["encoder"]
    got = kernel_session(path).run(outputs, feed)
    with torch.no_grad():
        _, *want = EncoderGraph(model)(*(torch.from_numpy(feed[k]) for k in ENCODER_INPUTS))
    return compare(outputs, got, want, tolerance)


def export_forced_decoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Export :class:`ForcedDecoderGraph` to ``path`` and check its cross-attention against PyTorch stepping through
    the same tokens, on rows of different target lengths, within ``tolerance``. Returns the largest difference."""
    model = model.eval()
    L = model.config.n_decoder_layers
    feed, _ = forced_example(model)
    names = forced_inputs(L)
    export_module(
        ForcedDecoderGraph(model),
        tuple(torch.from_numpy(feed[k]) for k in names),
        path,
        (names, FORCED_OUTPUTS),
        forced_axes(L),
    )
    return check_forced_decoder(model, path, tolerance)


def export_device_decoder(model: Transformer, path: Path, float16: bool = False) -> float:
    """Export :class:`DeviceDecoderGraph` with its selection tail (:func:`~model.export.selection.append_selection`)
    to ``path`` and check it against PyTorch's exact step (:func:`~model.export.check.check_device_decoder`).
    Returns the largest difference seen.

    ``float16``: weights, arithmetic, caches and cache inputs and outputs in float16 (ONNX Runtime's converter), the
    selection tail in float32; checked within FLOAT16_TOLERANCE instead of TOLERANCE.
    """
    import onnx

    model = model.eval()
    L = model.config.n_decoder_layers
    feed, _ = device_example(model)
    names = device_decoder_inputs(L, selection=False)
    export_module(
        DeviceDecoderGraph(model),
        tuple(torch.from_numpy(feed[k]) for k in names),
        path,
        (names, device_decoder_outputs(L, selection=False)),
        device_decoder_axes(L),
    )
    graph = onnx.load(str(path))
    if float16:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values out of float16 range were clamped": the masks' lowest float
            graph = convert_float_to_float16(graph, keep_io_types=False)
    append_selection(graph, model.config.vocab_size, model.config.pad_id)
    onnx.checker.check_model(graph)
    onnx.save(graph, str(path))
    return check_device_decoder(model, path, FLOAT16_TOLERANCE if float16 else TOLERANCE)
