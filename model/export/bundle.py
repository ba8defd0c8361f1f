"""Writing a bundle directory: the graphs, the tokenizer and a manifest with every file's sha256."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from model.export.build import export_device_decoder, export_fast_decoder, export_forced_decoder, export_graphs
from model.export.check import check_device_decoder, check_forced_decoder, check_graphs
from model.export.forms import (
    DEVICE_DECODER,
    EXACT_DECODER,
    EXACT_ENCODER,
    FORCED_DECODER,
    fast_decoder_form,
    with_graph_forms,
)
from model.export.store import WEIGHTS, add_weights, store_weights_once, stored_float16
from model.export.weights import graph_weights, load_model, load_state_dict, weight_aliases
from model.transformer import Transformer, TransformerConfig
from service.runtime.bundle import FORMAT, sha256

log = logging.getLogger(__name__)

FORCED = "decoder.forced.onnx"
DEVICE = "decoder.device.onnx"


def write_manifest(bundle_dir: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json with the sha256 of every other file in the bundle; a derived graph (the manifest's
    ``derived``) that is not there keeps the sha256 the manifest gives it."""
    files = sorted(p for p in bundle_dir.iterdir() if p.is_file() and p.name != "manifest.json")
    absent = set(manifest.get("derived", {})) - {p.name for p in files}
    kept = {name: h for name, h in manifest.get("sha256", {}).items() if name in absent}
    manifest = {**manifest, "sha256": dict(sorted({**kept, **{p.name: sha256(p) for p in files}}.items()))}
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


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


def check_weights_read_back(model: Transformer, bundle_dir: Path) -> None:
    """Raise unless :func:`~model.export.weights.load_state_dict` gives back every weight of ``model`` exactly."""
    _, state = load_state_dict(bundle_dir)
    for key, value in model.state_dict().items():
        if not torch.equal(state[key], value.detach().cpu()):
            raise ValueError(f"weight {key} does not read back exactly from the graphs")


def export_bundle(
    model: Transformer,
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
    force: bool = False,
) -> Path:
    """Export ``model`` and its tokenizer to a bundle directory.

    Args:
        model: the PyTorch model; put in eval mode.
        out_dir: the bundle directory; must not exist (or be empty) unless ``force``.
        tokenizer: ``{"source": spm_path, "target": spm_path}`` — one path twice for a joint model.
        vocab: piece -> id map when the model's ids are not the SentencePiece ids (Marian), else None.
        tokenizer_fields: more keys of the manifest's ``tokenizer`` entry (``source_prefix``, ``source_suffix``).
        scores, provenance: recorded in the manifest as they are.
        languages: more of the manifest's language entries, as they are: ``model_languages`` (the model's own
            codes) and, for a model with several targets, ``targets`` (each served code with its source prefix).
        float16: store the weights as float16 (:mod:`~model.export.store`); every weight must be a float16 value.
        force: replace an existing bundle.

    Raises:
        FileExistsError: ``out_dir`` holds files and ``force`` is false.
        ValueError: ONNX Runtime disagrees with PyTorch, or the weights cannot be read back exactly.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp_name:
        tmp = Path(tmp_name) / out_dir.name  # made by mkdir, so it has the mode of any new directory, not 0700
        tmp.mkdir()
        export_graphs(model, tmp)
        worst_fast = export_fast_decoder(model, tmp / "decoder.fast.onnx")
        worst_fast = max(
            worst_fast, export_forced_decoder(model, tmp / FORCED), export_device_decoder(model, tmp / DEVICE)
        )
        graphs = {"encoder": "encoder.onnx", "decoder": "decoder.onnx", "fast_decoder": "decoder.fast.onnx",
                  "forced_decoder": FORCED, "device_decoder": DEVICE}  # fmt: skip
        tok = copy_tokenizer(tokenizer, vocab, tmp) | (tokenizer_fields or {})
        manifest = {
            "format": FORMAT,
            "name": name,
            "source_lang": source_lang,
            "target_lang": target_lang,
            **(languages or {}),
            "model": model.config.to_dict(),
            "tokenizer": tok,
            "graphs": graphs,
            "graph_forms": {
                "encoder.onnx": EXACT_ENCODER.to_manifest(),
                "decoder.onnx": EXACT_DECODER.to_manifest(),
                "decoder.fast.onnx": fast_decoder_form(greedy=True).to_manifest(),
                FORCED: FORCED_DECODER.to_manifest(),
                DEVICE: DEVICE_DECODER.to_manifest(),
            },
            "weights": {
                "source": "float32 graph initializers named as the PyTorch state dict (model/export)",
                "stored": f"{WEIGHTS}: every graph's initializers of 1 KiB or more, each distinct tensor once"
                + (", as float16 behind a Cast to float32" if float16 else ""),
                "aliases": weight_aliases(model, graph_weights(tmp, graphs)),
            },
            "scores": scores or [],
            "provenance": {"exported": _dt.date.today().isoformat(), **(provenance or {})},
        }
        store_weights_once(tmp, list(graphs.values()), float16=float16)
        write_manifest(tmp, manifest)
        worst = check_graphs(model, tmp)
        check_weights_read_back(model, tmp)
        log.info("ONNX Runtime matches PyTorch within %.2g (fast, forced and device decoders %.2g); weights read back "
                 "exactly", worst, worst_fast)  # fmt: skip
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    return out_dir


def add_forced(bundle_dir: Path) -> int:
    """Add the forced decoder (:class:`~model.export.graphs.ForcedDecoderGraph`, ``decoder.forced.onnx``) to a
    bundle exported without it, from the bundle's own weights, and check it against PyTorch.

    Its weights are all the exact decoder's: the weights file is written again over every shipped graph, the
    forced one last, so that the other graphs and the weights file keep their bytes.

    Returns:
        The size of the weights file in bytes.

    Raises:
        ValueError: the forced decoder differs from PyTorch, or the weights file grew (a weight it does not share).
    """
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    log.info("forced decoder matches PyTorch within %.2g", export_forced_decoder(model, bundle_dir / FORCED))
    before = (bundle_dir / WEIGHTS).stat().st_size
    graphs = [name for name in manifest["graphs"].values() if isinstance(name, str) and name != FORCED]
    sources = [e["from"] for e in manifest.get("derived", {}).values() if e["from"] not in graphs]
    float16 = stored_float16(bundle_dir / manifest["graphs"]["decoder"])
    size = store_weights_once(bundle_dir, [*graphs, *dict.fromkeys(sources), FORCED], float16=float16)
    if size != before:
        raise ValueError(f"{WEIGHTS} grew from {before} to {size} bytes: the forced decoder holds a weight of its own")
    check_forced_decoder(model, bundle_dir / FORCED)
    manifest["graphs"]["forced_decoder"] = FORCED
    write_manifest(bundle_dir, with_graph_forms(manifest, {FORCED: FORCED_DECODER}))
    return size


def add_device(bundle_dir: Path) -> int:
    """Add the device decoder (:class:`~model.export.graphs.DeviceDecoderGraph` with its selection tail,
    ``decoder.device.onnx``) to a bundle exported without it, from the bundle's own weights, checked against
    PyTorch. Its weights are all the exact decoder's: it points at them in the weights file, and every other file
    keeps its bytes (:func:`~model.export.store.add_weights`).

    Returns:
        The size of the weights file in bytes.

    Raises:
        ValueError: the device decoder differs from PyTorch, or the weights file grew (a weight it does not share).
    """
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    model = load_model(bundle_dir)
    log.info("device decoder matches PyTorch within %.2g", export_device_decoder(model, bundle_dir / DEVICE))
    before = (bundle_dir / WEIGHTS).stat().st_size
    size = add_weights(bundle_dir, [DEVICE], float16=stored_float16(bundle_dir / manifest["graphs"]["decoder"]))
    if size != before:
        raise ValueError(f"{WEIGHTS} grew from {before} to {size} bytes: the device decoder holds a weight of its own")
    check_device_decoder(model, bundle_dir / DEVICE)
    manifest["graphs"]["device_decoder"] = DEVICE
    write_manifest(bundle_dir, with_graph_forms(manifest, {DEVICE: DEVICE_DECODER}))
    return size


def round_to_float16(model: Transformer) -> Transformer:
    """Round every floating weight of ``model`` (parameters and saved buffers) to the nearest float16 value, in
    place, so that :func:`export_bundle` can store it as float16; returns ``model``.

    Raises:
        ValueError: a weight lies beyond float16's range.
    """
    with torch.no_grad():
        for key, value in model.state_dict().items():  # the tensors share storage with the model's
            if not value.is_floating_point():
                continue
            half = value.half()
            if bool(torch.isinf(half).any()) and bool(torch.isfinite(value).all()):
                raise ValueError(f"weight {key} lies beyond float16's range; store it as float32")
            value.copy_(half.float())
    return model


def export_checkpoint(checkpoint: Path, out_dir: Path, force: bool = False, float16: bool = False) -> Path:
    """``attnserve export CHECKPOINT OUT_DIR``: a checkpoint written by model/train.py to a bundle; with
    ``float16``, its weights rounded to float16 values and stored so (:func:`round_to_float16`)."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    config = TransformerConfig.from_dict(ckpt["config"])
    model = Transformer(config)
    model.load_state_dict(ckpt["model"])
    if float16:
        round_to_float16(model)
    meta = ckpt["meta"]
    spm = Path(meta["spm"])
    return export_bundle(
        model,
        out_dir,
        name=meta["name"],
        source_lang=meta["source_lang"],
        target_lang=meta["target_lang"],
        tokenizer={"source": spm, "target": spm},
        provenance=meta.get("provenance"),
        float16=float16,
        force=force,
    )
