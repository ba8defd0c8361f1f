"""The model's weights read back from a bundle as PyTorch tensors (:func:`~model.export.builder.weights.read_weights`
reads them as numpy, without torch)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from model.export.builder.weights import read_weights
from model.transformer import Transformer, TransformerConfig


def load_state_dict(bundle_dir: Path) -> tuple[TransformerConfig, dict[str, Tensor]]:
    """Read a bundle's config and weights back from its float32 graphs (see :mod:`model.export`).

    Raises:
        ValueError: a weight is missing (the bundle was not written by the exporter).
    """
    config, found = read_weights(bundle_dir)
    state: dict[str, Tensor] = {}
    for key in Transformer(config).state_dict():
        if key not in found:
            raise ValueError(f"{bundle_dir}: weight {key} is in neither graph")
        state[key] = torch.from_numpy(found[key].copy())
    return config, state


def load_model(bundle_dir: Path) -> Transformer:
    """The bundle's PyTorch model, rebuilt from its float32 graphs (:func:`load_state_dict`)."""
    config, state = load_state_dict(bundle_dir)
    model = Transformer(config)
    model.load_state_dict(state)
    return model
