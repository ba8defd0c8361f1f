"""Writing a bundle from a config and its weights, without torch: every graph built (:mod:`.graphs`) and written
with its large initializers in the one shared weights file (:mod:`model.export.store`), the tokenizer, and the
manifest with every file's sha256 and each graph's form. One progress line a graph."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from model.config import TransformerConfig
from model.export.builder.graphs import decoder, device_decoder, encoder, fast_decoder, fast_encoder, forced_decoder
from model.export.builder.weights import Weights, aliases
from model.export.forms import (
    DEVICE_DECODER,
    EXACT_DECODER,
    EXACT_ENCODER,
    FORCED_DECODER,
    fast_decoder_form,
)
from model.export.store import WEIGHTS, store_tensors
from service.runtime.bundle import FORMAT, GraphForm
from service.runtime.derive import FUSED_ENCODER, add_int8
from service.runtime.kernels import switch_kernels
from service.runtime.manifest import Manifest

log = logging.getLogger(__name__)

Build = Callable[[TransformerConfig, Weights], onnx.ModelProto]

FORCED = "decoder.forced.onnx"
DEVICE = "decoder.device.onnx"
DEVICE_FLOAT16 = "decoder.device.float16.onnx"  # the float16 variant's device decoder


def logits_decoder(c: TransformerConfig, w: Weights) -> onnx.ModelProto:
    """The fast decoder with every row's logits and ONNX Runtime's attention kernels: what the int8 decoder is
    quantized from (the quantizer cannot load attnserve's kernels)."""
    graph = fast_decoder(c, w, greedy=False)
    switch_kernels(graph, c.h, "onnxruntime")
    return graph


def float16_of(build: Build) -> Build:
    """``build``'s graph with float16 weights and arithmetic inside, float32 at its inputs and outputs (ONNX
    Runtime's converter with ``keep_io_types``), so that the runner, its caches and /attention need nothing new."""

    def converted(c: TransformerConfig, w: Weights) -> onnx.ModelProto:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "values out of float16 range were clamped": the masks' lowest float
            graph: onnx.ModelProto = convert_float_to_float16(build(c, w), keep_io_types=True)
        return graph

    return converted


# file -> (the manifest's graphs key, its form, how it is built)
SERVED: dict[str, tuple[str, GraphForm, Build]] = {
    "encoder.onnx": ("encoder", EXACT_ENCODER, encoder),
    "decoder.onnx": ("decoder", EXACT_DECODER, decoder),
    "decoder.fast.onnx": ("fast_decoder", fast_decoder_form(greedy=True), fast_decoder),
    FORCED: ("forced_decoder", FORCED_DECODER, forced_decoder),
    DEVICE: ("device_decoder", DEVICE_DECODER, device_decoder),
}
INT8: dict[str, Build] = {FUSED_ENCODER: fast_encoder}  # the int8 encoder's source; the int8 graphs are derived
FLOAT16: dict[str, tuple[str, GraphForm, Build]] = {
    "encoder.float16.onnx": ("encoder", EXACT_ENCODER, float16_of(encoder)),
    "decoder.float16.onnx": ("decoder", EXACT_DECODER, float16_of(decoder)),
    DEVICE_FLOAT16: ("device_decoder", DEVICE_DECODER, lambda c, w: device_decoder(c, w, float16=True)),
}


def build_graphs(c: TransformerConfig, weights: Weights, out_dir: Path, builds: dict[str, Build],
                 float16: bool = False) -> int:  # fmt: skip
    """Build each graph of ``builds`` (file -> build) into ``out_dir``, its initializers of 1 KiB or more in a new
    WEIGHTS file, each distinct tensor once (``float16``: stored as float16 behind casts; they must be float16
    values). Logs a line a graph. Returns the size of WEIGHTS in bytes."""
    data, offsets = bytearray(), dict[Any, Any]()
    for name, build in builds.items():
        start = time.perf_counter()
        graph = build(c, weights)
        store_tensors(graph, data, offsets, float16)
        onnx.save(graph, str(out_dir / name))
        log.info("built %s in %.1f s", name, time.perf_counter() - start)
    (out_dir / WEIGHTS).write_bytes(bytes(data))
    return len(data)


def copy_tokenizer(tokenizer: dict[str, Path], vocab: dict[str, int] | None, bundle_dir: Path) -> dict[str, Any]:
    """Copy the SentencePiece models (one ``spm.model`` for a joint model) and the vocabulary, if any, into
    ``bundle_dir``; return the manifest's ``tokenizer`` entry."""
    tok: dict[str, Any] = {"kind": "sentencepiece", "vocab": None}
    for role in ("source", "target"):
        src = tokenizer[role]
        dest = "spm.model" if tokenizer["source"] == tokenizer["target"] else f"{role}.spm"
        shutil.copyfile(src, bundle_dir / dest)
        tok[role] = dest
    if vocab is not None:
        (bundle_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n")
        tok["vocab"] = "vocab.json"
    return tok


def write_bundle(
    c: TransformerConfig,
    weights: Weights,
    out_dir: Path,
    *,
    name: str,
    source_lang: str,
    target_lang: str,
    tokenizer: dict[str, Path],
    vocab: dict[str, int] | None = None,
    tokenizer_fields: dict[str, Any] | None = None,
    scores: list[dict[str, Any]] | None = None,
    provenance: dict[str, Any] | None = None,
    languages: dict[str, Any] | None = None,
    float16: bool = False,
    variants: tuple[str, ...] = (),
    force: bool = False,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Write the bundle of a config and its weights to ``out_dir``: put together beside it, checked, renamed.

    Args:
        c, weights: the model's config and state-dict weights (numpy; tied and aliased keys may be left out).
        out_dir: the bundle directory; must not exist (or be empty) unless ``force``.
        tokenizer: ``{"source": spm_path, "target": spm_path}`` — one path twice for a joint model.
        vocab: piece -> id map when the model's ids are not the SentencePiece ids (Marian), else None.
        tokenizer_fields: more keys of the manifest's ``tokenizer`` entry (``source_prefix``, ``source_suffix``).
        scores, provenance: recorded in the manifest as they are.
        languages: more of the manifest's language entries, as they are (``model_languages``, ``targets``).
        float16: store the weights as float16 behind casts; every weight must be a float16 value.
        variants: ``int8`` (the fast graphs it is derived from, then derived here) and/or ``float16`` (GPU graphs).
        force: replace an existing bundle.
        check: called on the staged bundle before it replaces ``out_dir`` (the exporter's parity with PyTorch).

    Raises:
        FileExistsError: ``out_dir`` holds files and ``force`` is false.
        ValueError: ``float16`` and a weight that float16 does not hold exactly; ``check``'s errors.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    unknown = set(variants) - {"int8", "float16"}
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}: int8 and float16 are built")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp_name:
        tmp = Path(tmp_name) / out_dir.name  # made by mkdir, so it has the mode of any new directory, not 0700
        tmp.mkdir()
        builds: dict[str, Build] = {file: build for file, (_, _, build) in SERVED.items()}
        graphs: dict[str, Any] = {role: file for file, (role, _, _) in SERVED.items()}
        forms = {file: form for file, (_, form, _) in SERVED.items()}
        if "int8" in variants:
            builds.update(INT8)
        if "float16" in variants:
            builds.update({file: build for file, (_, _, build) in FLOAT16.items()})
            graphs["float16"] = {role: file for file, (role, _, _) in FLOAT16.items()}
            forms.update({file: form for file, (_, form, _) in FLOAT16.items()})
        build_graphs(c, weights, tmp, builds, float16=float16)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "name": name,
            "source_lang": source_lang,
            "target_lang": target_lang,
            **(languages or {}),
            "model": c.to_dict(),
            "tokenizer": copy_tokenizer(tokenizer, vocab, tmp) | (tokenizer_fields or {}),
            "graphs": graphs,
            "graph_forms": {file: form.to_manifest() for file, form in forms.items()},
            "weights": {
                "source": "float32 graph initializers named as the PyTorch state dict (model/export/builder)",
                "stored": f"{WEIGHTS}: every graph's initializers of 1 KiB or more, each distinct tensor once"
                + (", as float16 behind a Cast to float32" if float16 else ""),
                "aliases": aliases(c),
            },
            "scores": scores or [],
            "provenance": {"exported": _dt.date.today().isoformat(), **(provenance or {})},
        }
        Manifest(manifest).write_with_checksums(tmp)
        if "int8" in variants:
            add_int8(tmp)  # derived from the fast graphs, the manifest written again with them
        if check is not None:
            check(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    return out_dir
