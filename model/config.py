"""The model's hyperparameters, one frozen dataclass saved in the bundle: torch-free, so that the graph builder
(model/export/builder) and the importers read it without torch."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Hyperparameters of one model; saved as the bundle manifest's ``"model"`` object.

    The defaults are the paper's base model (§6.2, Table 3) with Marian's special-token layout.
    """

    vocab_size: int
    d_model: int = 512
    h: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    activation: str = "relu"  # relu (the paper) | swish (Marian) | gelu
    max_positions: int = 512
    pad_id: int  # opus-mt puts <pad> last; its embedding row stays zero
    eos_id: int = 0
    unk_id: int = 1
    decoder_start_id: int  # Marian starts decoding from the pad id
    scale_embedding: bool = True  # multiply embeddings by √d_model (§3.4)
    tie_embeddings: bool = True  # source, target embeddings and pre-softmax projection share one matrix (§3.4)
    final_logits_bias: bool = False  # Marian adds a (frozen) bias to the logits
    normalize_before: bool = False  # pre-LN instead of the paper's post-LN; adds a final LayerNorm to each stack
    layer_norm_eps: float = 1e-5  # OpenNMT-py models run on CTranslate2 with the epsilon its config.json gives
    position_table: str = "sinusoid"  # sinusoid (computed, Marian's layout) | weights (a table among the weights)

    def __post_init__(self) -> None:
        if self.d_model % self.h:
            raise ValueError(f"d_model={self.d_model} must be divisible by h={self.h}")
        if self.position_table not in ("sinusoid", "weights"):
            raise ValueError(f"position_table={self.position_table!r} must be 'sinusoid' or 'weights'")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation={self.activation!r} must be one of {sorted(ACTIVATIONS)}")
        for name in ("pad_id", "eos_id", "decoder_start_id", "unk_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name}={getattr(self, name)} is outside the vocabulary (size {self.vocab_size})")

    @property
    def d_k(self) -> int:
        return self.d_model // self.h

    def to_dict(self) -> dict[str, Any]:
        """The fields, those in LATER_FIELDS left out at their defaults (older manifests and checkpoints match)."""
        return {k: v for k, v in asdict(self).items() if k not in LATER_FIELDS or v != LATER_FIELDS[k]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


ACTIVATIONS = ("relu", "swish", "gelu")  # model/transformer.py maps each to its function
LATER_FIELDS: dict[str, Any] = {"layer_norm_eps": 1e-5, "position_table": "sinusoid"}  # field -> its default
