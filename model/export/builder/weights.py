"""The weights as the builder takes them (state-dict key -> float32 numpy array) and as a bundle gives them back:
its float32 graphs' initializers keep the state-dict names (``model.`` first; those stored as float16 behind a Cast
read back as float32, see :mod:`model.export.store`), and the manifest's ``weights.aliases`` names the initializer
of each key that no graph carries under its own name (tied embeddings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from model.config import TransformerConfig
from model.export.builder.ops import weight_key
from model.export.store import FLOAT16_SUFFIX
from service.runtime.manifest import Manifest

Weights = dict[str, np.ndarray]


def sinusoids(max_positions: int, d_model: int) -> np.ndarray:
    """model/transformer.py's sinusoids: PE(pos, i), all sines in the first half of the features, all cosines in
    the second (Marian's layout) -> (max_positions, d_model) float32."""
    position = np.arange(max_positions, dtype=np.float64)[:, None]  # (P, 1)
    inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # (ceil(d/2),)
    angles = position * inv_freq  # (P, ceil(d/2))
    half = d_model // 2 + d_model % 2
    pe = np.zeros((max_positions, d_model), np.float64)
    pe[:, :half] = np.sin(angles)
    pe[:, half:] = np.cos(angles[:, : d_model // 2])
    return pe.astype(np.float32)


def aliases(c: TransformerConfig) -> dict[str, str]:
    """State-dict keys the graphs do not carry -> the key whose initializer holds the same tensor."""
    keys = ("tgt_embed.lut.weight", "generator.proj.weight")
    return {k: weight_key(c, k) for k in keys if weight_key(c, k) != k}


def onnx_initializers(path: Path) -> Weights:
    """A graph's initializers by name; float16-stored weights as the float32 their Cast gives, under its name."""
    found = {}
    for t in onnx.load(str(path)).graph.initializer:
        array = numpy_helper.to_array(t)
        if t.name.endswith(FLOAT16_SUFFIX) and array.dtype == np.float16:
            found[t.name.removesuffix(FLOAT16_SUFFIX)] = array.astype(np.float32)
        else:
            found[t.name] = array
    return found


def graph_weights(bundle_dir: Path, graphs: dict[str, str]) -> Weights:
    """The float32 exact graphs' initializers by state-dict name (``model.`` removed)."""
    found: Weights = {}
    for role in ("encoder", "decoder"):
        for name, array in onnx_initializers(bundle_dir / graphs[role]).items():
            found[name.removeprefix("model.")] = array
    return found


def read_weights(bundle_dir: Path) -> tuple[TransformerConfig, Weights]:
    """A bundle's config and weights, every aliased key (the manifest's ``weights.aliases``) filled in."""
    manifest = Manifest.read(bundle_dir)
    found = graph_weights(bundle_dir, manifest.graphs)
    for key, twin in manifest.weight_aliases.items():
        if twin in found:
            found[key] = found[twin]
    return TransformerConfig.from_dict(manifest.model), found
