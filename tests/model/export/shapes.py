"""Model shapes the export tests cover, and source batches for them."""

from __future__ import annotations

import numpy as np

from model.transformer import Transformer

CONFIGS = {
    "h8-post-ln-relu": {"d_model": 64, "h": 8, "n_encoder_layers": 2, "n_decoder_layers": 2},
    "h1-unequal-depth": {"d_model": 16, "h": 1, "n_encoder_layers": 3, "n_decoder_layers": 1},
    "pre-ln-swish": {"d_model": 32, "h": 4, "normalize_before": True, "activation": "swish"},
    "untied-gelu": {"d_model": 32, "h": 2, "tie_embeddings": False, "activation": "gelu", "scale_embedding": False},
}


def sources(model: Transformer) -> list[list[int]]:
    """A padded batch's worth of different lengths, each ending with </s>."""
    rng = np.random.default_rng(7)
    c = model.config
    return [[*rng.integers(2, c.vocab_size - 1, size=n).tolist(), c.eos_id] for n in (9, 5, 2, 7)]
