"""The model's weights read back from a bundle's float32 graphs: their initializers keep the state-dict names (those
stored as float16 behind a Cast read back as float32, see :mod:`model.export.store`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import Tensor

from model.export.store import FLOAT16_SUFFIX
from model.transformer import Transformer, TransformerConfig


def onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    """A graph's initializers by name; float16-stored weights as the float32 their Cast gives, under its name."""
    found = {}
    for t in onnx.load(str(path)).graph.initializer:
        array = numpy_helper.to_array(t)
        if t.name.endswith(FLOAT16_SUFFIX) and array.dtype == np.float16:
            found[t.name.removesuffix(FLOAT16_SUFFIX)] = array.astype(np.float32)
        else:
            found[t.name] = array
    return found


def graph_weights(bundle_dir: Path, graphs: dict[str, str]) -> dict[str, np.ndarray]:
    """The float32 graphs' initializers by state-dict name (the exporter prefixes ``model.``)."""
    found: dict[str, np.ndarray] = {}
    for role in ("encoder", "decoder"):
        for name, array in onnx_initializers(bundle_dir / graphs[role]).items():
            found[name.removeprefix("model.")] = array
    return found


def weight_aliases(model: Transformer, found: dict[str, np.ndarray]) -> dict[str, str]:
    """State-dict names the graphs do not carry -> the initializer that holds the same tensor.

    The exporter keeps one initializer for identical tensors (tied embeddings, LayerNorms still at their
    initial ones and zeros); this map, saved in the manifest, undoes that exactly.

    Raises:
        ValueError: a weight is nowhere in the graphs.
    """
    aliases = {}
    for key, value in model.state_dict().items():
        if key in found:
            continue
        array = value.detach().cpu().numpy()
        twin = next((n for n, a in found.items() if a.shape == array.shape and np.array_equal(a, array)), None)
        if twin is None:
            raise ValueError(f"weight {key} is in neither graph")
        aliases[key] = twin
    return aliases


def load_state_dict(bundle_dir: Path) -> tuple[TransformerConfig, dict[str, Tensor]]:
    """Read a bundle's config and weights back from its float32 graphs (see :mod:`model.export`).

    Raises:
        ValueError: a weight is missing (the bundle was not written by :func:`export_bundle`).
    """
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    config = TransformerConfig.from_dict(manifest["model"])
    found = graph_weights(bundle_dir, manifest["graphs"])
    aliases = manifest["weights"]["aliases"]
    state: dict[str, Tensor] = {}
    for key in Transformer(config).state_dict():
        array = found.get(aliases.get(key, key))
        if array is None:
            raise ValueError(f"{bundle_dir}: weight {key} is in neither graph")
        state[key] = torch.from_numpy(array.copy())
    return config, state


def load_model(bundle_dir: Path) -> Transformer:
    """The bundle's PyTorch model, rebuilt from its float32 graphs (:func:`load_state_dict`)."""
    config, state = load_state_dict(bundle_dir)
    model = Transformer(config)
    model.load_state_dict(state)
    return model
