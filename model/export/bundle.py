"""Writing a bundle directory: the graphs, the tokenizer and a manifest with every file's sha256."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from model.export.build import export_device_decoder, export_forced_decoder, state_weights
from model.export.builder.write import DEVICE, FORCED, write_bundle
from model.export.check import check_device_decoder, check_fast_decoder, check_forced_decoder, check_graphs
from model.export.forms import DEVICE_DECODER, FORCED_DECODER
from model.export.store import WEIGHTS, add_weights, store_weights_once, stored_float16
from model.export.weights import load_model, load_state_dict
from model.transformer import Transformer, TransformerConfig
from service.runtime.manifest import Manifest

log = logging.getLogger(__name__)


def check_weights_read_back(model: Transformer, bundle_dir: Path) -> None:
    """Raise unless :func:`~model.export.weights.load_state_dict` gives back every weight of ``model`` exactly."""
    _, state = load_state_dict(bundle_dir)
    for key, value in model.state_dict().items():
        if not torch.equal(state[key], value.detach().cpu()):
            raise ValueError(f"weight {key} does not read back exactly from the graphs")


def export_bundle(model: Transformer, out_dir: Path, *, variants: tuple[str, ...] = (), **fields: Any) -> Path:
    """Export ``model`` and its tokenizer to a bundle directory: the builder's bundle of its weights
    (:func:`~model.export.builder.write.write_bundle`, which takes ``fields``: name, languages, tokenizer, float16,
    force, ...), every graph checked against PyTorch and the weights read back exactly before it is renamed into
    place.

    Raises:
        FileExistsError: ``out_dir`` holds files and ``force`` is false.
        ValueError: ONNX Runtime disagrees with PyTorch, or the weights cannot be read back exactly.
    """
    model = model.eval()

    def check(staged: Path) -> None:
        worst = max(
            check_graphs(model, staged),
            check_fast_decoder(model, staged / "decoder.fast.onnx", greedy=True),
            check_forced_decoder(model, staged / FORCED),
            check_device_decoder(model, staged / DEVICE),
        )
        check_weights_read_back(model, staged)
        log.info("ONNX Runtime matches PyTorch within %.2g; weights read back exactly", worst)

    return write_bundle(model.config, state_weights(model), out_dir, variants=variants, check=check, **fields)


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
    manifest = Manifest.read(bundle_dir)
    model = load_model(bundle_dir)
    log.info("forced decoder matches PyTorch within %.2g", export_forced_decoder(model, bundle_dir / FORCED))
    before = (bundle_dir / WEIGHTS).stat().st_size
    graphs = [name for name in manifest.graph_files if name != FORCED]
    sources = [e["from"] for e in manifest.derived.values() if e["from"] not in graphs]
    float16 = stored_float16(bundle_dir / manifest.graphs["decoder"])
    size = store_weights_once(bundle_dir, [*graphs, *dict.fromkeys(sources), FORCED], float16=float16)
    if size != before:
        raise ValueError(f"{WEIGHTS} grew from {before} to {size} bytes: the forced decoder holds a weight of its own")
    check_forced_decoder(model, bundle_dir / FORCED)
    manifest.graphs["forced_decoder"] = FORCED
    manifest.add_graph_forms({FORCED: FORCED_DECODER.to_manifest()})
    manifest.write_with_checksums(bundle_dir)
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
    manifest = Manifest.read(bundle_dir)
    model = load_model(bundle_dir)
    log.info("device decoder matches PyTorch within %.2g", export_device_decoder(model, bundle_dir / DEVICE))
    before = (bundle_dir / WEIGHTS).stat().st_size
    size = add_weights(bundle_dir, [DEVICE], float16=stored_float16(bundle_dir / manifest.graphs["decoder"]))
    if size != before:
        raise ValueError(f"{WEIGHTS} grew from {before} to {size} bytes: the device decoder holds a weight of its own")
    check_device_decoder(model, bundle_dir / DEVICE)
    manifest.graphs["device_decoder"] = DEVICE
    manifest.add_graph_forms({DEVICE: DEVICE_DECODER.to_manifest()})
    manifest.write_with_checksums(bundle_dir)
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
