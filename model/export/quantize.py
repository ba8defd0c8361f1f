"""The bundle's variants: int8 (dynamic quantization of the fast graphs) and float16 (for GPUs)."""

from __future__ import annotations

import json
import logging
import tempfile
import warnings
from pathlib import Path

import onnx

from model.export.build import export_fast_decoder, export_fast_encoder
from model.export.bundle import write_manifest
from model.export.check import check_graphs
from model.export.forms import EXACT_DECODER, EXACT_ENCODER, FAST_ENCODER, fast_decoder_form, with_graph_forms
from model.export.kernels import attention_kernels, kernel_session
from model.export.weights import load_model

log = logging.getLogger(__name__)


# float16 keeps 11 significant bits: attention scores of tens round by hundredths and move a softmax weight by a few
# hundredths at most; a broken conversion is off by far more.
FLOAT16_TOLERANCE = 0.1


def add_int8(bundle_dir: Path) -> None:
    """Add the ``int8`` variant for /translate: ONNX Runtime dynamic quantization (int8 weights of every MatMul)
    of the fast encoder and of the fast decoder (fused attention, no attention outputs; the decoder's caches
    written in place), rebuilt from the bundle's own weights and checked against PyTorch before they are quantized.

    The graphs are first optimized offline (transposes of weights folded into initializers) so that the
    quantizer sees constant MatMul weights: the encoder with attnserve's kernels registered, the fast decoder
    through ONNX Runtime's attention kernels (quant_pre_process cannot load attnserve's) and back to attnserve's at
    the end. The float32 graphs stay: /attention serves exact weights from them, and they carry the weights for
    ``export-marian``.
    """
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    with tempfile.TemporaryDirectory() as tmp:
        encoder, decoder = Path(tmp) / "encoder.fast.onnx", Path(tmp) / "decoder.fast.onnx"
        log.info("fast encoder matches PyTorch within %.2g", export_fast_encoder(model, encoder))
        worst = export_fast_decoder(model, decoder, kernels="onnxruntime")  # what the quantizer can load
        log.info("fast decoder matches PyTorch within %.2g", worst)
        prepared = {role: Path(tmp) / f"{role}.prepared.onnx" for role in ("encoder", "decoder")}
        kernel_session(encoder, optimized=prepared["encoder"])
        quant_pre_process(decoder, prepared["decoder"], skip_symbolic_shape=True)
        for role, graph in prepared.items():
            quantize_dynamic(graph, bundle_dir / f"{role}.int8.onnx", weight_type=QuantType.QInt8)
        attention_kernels(bundle_dir / "decoder.int8.onnx", model.config.h, "attnserve")
        attention_kernels(bundle_dir / "encoder.int8.onnx", model.config.h, "attnserve")  # imports what it uses
    manifest["graphs"]["int8"] = {role: f"{role}.int8.onnx" for role in ("encoder", "decoder")}
    forms = {"encoder.int8.onnx": FAST_ENCODER, "decoder.int8.onnx": fast_decoder_form(greedy=False)}
    write_manifest(bundle_dir, with_graph_forms(manifest, forms))


def add_float16(bundle_dir: Path) -> None:
    """Add the ``float16`` variant, for GPUs: the exact graphs (attention outputs included) with float16 weights
    and arithmetic inside and float32 at their inputs and outputs (ONNX Runtime's converter with
    ``keep_io_types``), so the runner, its caches and /attention need nothing new. Checked against PyTorch in
    ONNX Runtime on the CPU (within FLOAT16_TOLERANCE) before the manifest lists it.

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
    log.info("float16 graphs match PyTorch within %.2g", worst)
    manifest["graphs"]["float16"] = variant
    forms = {variant["encoder"]: EXACT_ENCODER, variant["decoder"]: EXACT_DECODER}
    write_manifest(bundle_dir, with_graph_forms(manifest, forms))


ADD_VARIANT = {"int8": add_int8, "float16": add_float16}  # variant name -> what adds it to a bundle
