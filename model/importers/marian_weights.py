"""A MarianMTModel directory's weights as numpy, without torch: ``model.safetensors`` (``safetensors.numpy``), or
``pytorch_model.bin`` where torch is installed; under our state-dict names (model/importers/marian.py's
:func:`~model.importers.marian.hf_name`), tied weights checked tied."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

SAFETENSORS = "model.safetensors"
PYTORCH = "pytorch_model.bin"
SHARED = "model.shared.weight"
TIED = ("lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")


def read_hf_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    """The checkpoint's tensors by Hugging Face name, as float32.

    Raises:
        ValueError: no weights file, or only ``pytorch_model.bin`` and no torch to read it (one line naming the fix).
    """
    if (hf_dir / SAFETENSORS).is_file():
        from safetensors.numpy import load_file

        tensors = load_file(str(hf_dir / SAFETENSORS))
    elif (hf_dir / PYTORCH).is_file():
        if importlib.util.find_spec("torch") is None:
            raise ValueError(
                f"{hf_dir / PYTORCH}: reading it needs torch; install torch (pip install torch), or convert the "
                f"checkpoint to {SAFETENSORS} (transformers' save_pretrained writes it)"
            )
        import torch

        state = torch.load(hf_dir / PYTORCH, map_location="cpu", weights_only=True)
        tensors = {k: v.float().numpy() for k, v in state.items()}
    else:
        raise ValueError(f"{hf_dir}: no {SAFETENSORS} or {PYTORCH}")
    return {k: np.asarray(v, np.float32) for k, v in tensors.items()}


def check_tied(hf: dict[str, np.ndarray]) -> np.ndarray:
    """The one matrix of the output projection and both embeddings, as Marian trains them; returns it.

    Raises:
        ValueError: naming the weight that differs (checkpoints broken upstream, transformers #26216).
    """
    names = [n for n in (SHARED, *TIED) if n in hf]
    if not names:
        raise ValueError(f"the checkpoint has no embeddings ({SHARED})")
    shared = hf[names[0]]
    for name in names[1:]:
        if hf[name].shape != shared.shape or not np.array_equal(hf[name], shared):
            raise ValueError(
                f"{name} differs from {names[0]}: the checkpoint's tied weights are not tied (broken upstream, see "
                "transformers #26216); fix or re-download the checkpoint"
            )
    return shared
