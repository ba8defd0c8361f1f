"""The bundle's variants: int8 (dynamic quantization of the fast graphs) and float16 (for GPUs)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import onnx

from model.export.build import export_device_decoder, export_fast_encoder
from model.export.builder.write import DEVICE_FLOAT16
from model.export.check import FLOAT16_TOLERANCE, check_graphs
from model.export.forms import DEVICE_DECODER, EXACT_DECODER, EXACT_ENCODER
from model.export.store import add_weights, store_weights_once, stored_float16
from model.export.weights import load_model
from service.runtime.derive import FUSED_ENCODER
from service.runtime.derive import add_int8 as derive_int8
from service.runtime.manifest import Manifest

log = logging.getLogger(__name__)


def add_int8(bundle_dir: Path) -> None:
    """Add the ``int8`` variant for /translate: ONNX Runtime dynamic quantization (int8 weights of every MatMul,
    a scale per output column) of the fast encoder, rebuilt from the bundle's own weights and checked against
    PyTorch, and of the fast decoder (fused attention, no attention outputs; the decoder's caches written in place).

    The bundle ships the fast encoder (``encoder.fast.onnx``, attnserve's kernels), its weights in the shared
    weights file, and derives the int8 graphs from it and from the fast decoder without torch
    (:func:`service.runtime.derive.add_int8`, again on a load that finds them missing); the manifest's ``derived``
    says how and its sha256 what they must be. The float32 graphs stay: /attention serves exact weights from them,
    and they carry the weights for ``export-marian``. The source is stored as the bundle's other weights are
    (float16 behind casts in a float16-stored bundle, which the derivation folds).
    """
    manifest = Manifest.read(bundle_dir)
    model = load_model(bundle_dir)
    log.info("fast encoder matches PyTorch within %.2g", export_fast_encoder(model, bundle_dir / FUSED_ENCODER))
    float16 = stored_float16(bundle_dir / manifest.graphs["encoder"])
    store_weights_once(bundle_dir, [*manifest.graph_files, FUSED_ENCODER], float16=float16)
    derive_int8(bundle_dir)


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

    manifest = Manifest.read(bundle_dir)
    model = load_model(bundle_dir)
    variant = {role: f"{role}.float16.onnx" for role in ("encoder", "decoder")}
    for role, name in variant.items():
        graph = onnx.load(str(bundle_dir / manifest.graphs[role]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values out of float16 range were clamped": the masks' -1e9 and such
            onnx.save(convert_float_to_float16(graph, keep_io_types=True), str(bundle_dir / name))
    worst = check_graphs(model, bundle_dir, FLOAT16_TOLERANCE, (variant["encoder"], variant["decoder"]))
    forms = {variant["encoder"]: EXACT_ENCODER, variant["decoder"]: EXACT_DECODER}
    if isinstance(manifest.graphs.get("device_decoder"), str):
        variant["device_decoder"] = DEVICE_FLOAT16
        worst = max(worst, export_device_decoder(model, bundle_dir / DEVICE_FLOAT16, float16=True))
        forms[DEVICE_FLOAT16] = DEVICE_DECODER
    log.info("float16 graphs match PyTorch within %.2g", worst)
    add_weights(bundle_dir, list(variant.values()))
    manifest.graphs["float16"] = variant
    manifest.add_graph_forms({name: form.to_manifest() for name, form in forms.items()})
    manifest.write_with_checksums(bundle_dir)


ADD_VARIANT = {"int8": add_int8, "float16": add_float16}  # variant name -> what adds it to a bundle
