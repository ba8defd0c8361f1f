"""What the decoder needs from a step runner (service/runtime/runner.py's forms, one a cache layout, or a test's fake):
the model's spec, the caches' kind of array, the decoder graph's form, an encoder call and a decoder step."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from service.runtime.bundle import GraphForm, ModelSpec
from service.runtime.runner import EncoderOutput, StepInput, StepOutput
from service.runtime.tensors import Tensors


class StepRunner(Protocol):
    """An encoder and a decoder step on the key/value cache (see :class:`service.runtime.runner.Runner`)."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def tensors(self) -> Tensors: ...

    @property
    def form(self) -> GraphForm: ...  # the decoder graph's: it picks the cache layout

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        """input_ids, attention_mask (texts numbered per row), position_ids (B, S) int64 -> cross keys/values."""
        ...

    def step(self, step: StepInput) -> StepOutput:
        """One decoding step for B rows, with the fields of ``step`` that the form takes: the self-attention mask
        (appended caches), greedy ``tokens`` instead of logits (in-place caches of greedy_tokens graphs), or the
        rows' parents and sources and their ``candidates`` best tokens (gathered caches)."""
        ...
