"""The bundle's variants: int8 (dynamic quantization of the fast graphs) and float16 (for GPUs)."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import onnx
import onnxruntime as ort

from model.export.build import export_device_decoder, export_fast_decoder, export_fast_encoder
from model.export.builder.write import DEVICE_FLOAT16, INT8_HOW, INT8_SOURCES, write_manifest
from model.export.check import FLOAT16_TOLERANCE, check_graphs
from model.export.forms import (
    DEVICE_DECODER,
    EXACT_DECODER,
    EXACT_ENCODER,
    FAST_ENCODER,
    fast_decoder_form,
    with_graph_forms,
)
from model.export.store import add_weights, store_weights_once, stored_float16
from model.export.weights import load_model
from service.runtime.derive import derive_missing

log = logging.getLogger(__name__)


def add_int8(bundle_dir: Path) -> None:
    """Add the ``int8`` variant for /translate: ONNX Runtime dynamic quantization (int8 weights of every MatMul)
    of the fast encoder and of the fast decoder (fused attention, no attention outputs; the decoder's caches
    written in place), rebuilt from the bundle's own weights and checked against PyTorch.

    The bundle ships the two fast graphs the quantizer reads (INT8_SOURCES: the encoder with attnserve's kernels,
    the decoder with ONNX Runtime's, which quant_pre_process can load), their weights in the shared weights file,
    and derives the int8 graphs from them without torch (:mod:`service.runtime.derive`, on first load); the manifest's
    ``derived`` says how and its sha256 what they must be. The float32 graphs stay: /attention serves exact
    weights from them, and they carry the weights for ``export-marian``. The sources are stored as the bundle's
    other weights are (float16 behind casts in a float16-stored bundle, which the derivation folds).
    """
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    sources = {role: bundle_dir / name for role, name in INT8_SOURCES.items()}
    log.info("fast encoder matches PyTorch within %.2g", export_fast_encoder(model, sources["encoder"]))
    worst = export_fast_decoder(model, sources["decoder"], kernels="onnxruntime")  # what the quantizer can load
    log.info("fast decoder matches PyTorch within %.2g", worst)
    graphs = [name for name in manifest["graphs"].values() if isinstance(name, str)]
    float16 = stored_float16(bundle_dir / manifest["graphs"]["encoder"])
    store_weights_once(bundle_dir, [*graphs, *INT8_SOURCES.values()], float16=float16)
    manifest["graphs"]["int8"] = {role: f"{role}.int8.onnx" for role in ("encoder", "decoder")}
    manifest["derived"] = {
        **manifest.get("derived", {}),
        **{
            f"{role}.int8.onnx": {"from": INT8_SOURCES[role], "by": INT8_HOW[role], "onnxruntime": ort.__version__}
            for role in INT8_SOURCES
        },
    }
    derive_missing(bundle_dir, manifest, force=True)
    forms = {"encoder.int8.onnx": FAST_ENCODER, "decoder.int8.onnx": fast_decoder_form(greedy=False)}
    write_manifest(bundle_dir, with_graph_forms(manifest, forms))


def add_float16(bundle_dir: Path) -> None:
    """Add the ``float16`` variant, for GPUs: the exact graphs (attention outputs included) with float16 weights
    and arithmetic inside and float32 at their inputs and outputs (ONNX Runtime's converter with
    ``keep_io_types``), so the runner, its caches and /attention need nothing new; and, where the bundle has the
    float32 device decoder, the float16 device decoder (float16 caches in and out, float32 scores:
    :func:`~model.export.build.export_device_decoder`). Each is checked against PyTorch in ONNX Runtime on the CPU
    (within FLOAT16_TOLERANCE) before the manifest lists it. Their weights join the weights file, each distinct
    tensor once (a float16-stored bundle holds them already), the other files kept as they are.

    Raises:
        ValueError: the float16 graphs differ from PyTorch by more than FLOAT16_TOLERANCE.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    variant = {role: f"{role}.float16.onnx" for role in ("encoder", "decoder")}
    for role, name in variant.items():
        graph = onnx.load(str(bundle_dir / manifest["graphs"][role]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values out of float16 range were clamped": the masks' -1e9 and such
            onnx.save(convert_float_to_float16(graph, keep_io_types=True), str(bundle_dir / name))
    worst = check_graphs(model, bundle_dir, FLOAT16_TOLERANCE, (variant["encoder"], variant["decoder"]))
    forms = {variant["encoder"]: EXACT_ENCODER, variant["decoder"]: EXACT_DECODER}
    if isinstance(manifest["graphs"].get("device_decoder"), str):
        variant["device_decoder"] = DEVICE_FLOAT16
        worst = max(worst, export_device_decoder(model, bundle_dir / DEVICE_FLOAT16, float16=True))
        forms[DEVICE_FLOAT16] = DEVICE_DECODER
    log.info("float16 graphs match PyTorch within %.2g", worst)
    add_weights(bundle_dir, list(variant.values()))
    manifest["graphs"]["float16"] = variant
    write_manifest(bundle_dir, with_graph_forms(manifest, forms))


ADD_VARIANT = {"int8": add_int8, "float16": add_float16}  # variant name -> what adds it to a bundle
