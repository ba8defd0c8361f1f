"""What the decoder needs from a step runner (service/runtime/runner.py's :class:`~service.runtime.runner.Runner`, or a
test's
fake): the model's spec, the caches' kind of array, the decoder graph's form, an encoder call and a decoder step."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from service.runtime.bundle import GraphForm, ModelSpec
from service.runtime.runner import EncoderOutput, StepOutput
from service.runtime.tensors import Cache, Tensors


class StepRunner(Protocol):
    """An encoder and a decoder step on the key/value cache (see :meth:`service.runtime.runner.Runner.step`)."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def tensors(self) -> Tensors: ...

    @property
    def form(self) -> GraphForm: ...  # the decoder graph's: it picks the cache layout

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        """input_ids, attention_mask (texts numbered per row), position_ids (B, S) int64 -> cross keys/values."""
        ...

    def step(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        encoder_attention_mask: np.ndarray,
        self_attention_mask: np.ndarray | None,
        cross_keys: list[Cache],
        cross_values: list[Cache],
        past_keys: list[Cache],
        past_values: list[Cache],
        tokens: bool = False,
    ) -> StepOutput:
        """One decoding step for B rows (``tokens``: greedy tokens instead of logits, greedy_tokens graphs only)."""
        ...

    def step_candidates(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        parent_rows: np.ndarray,
        source_rows: np.ndarray,
        encoder_attention_mask: np.ndarray,
        cross_keys: list[Cache],
        cross_values: list[Cache],
        past_keys: list[Cache],
        past_values: list[Cache],
        candidates: int,
    ) -> StepOutput:
        """One device decoder step (``form.candidates``): rows on their parents' past caches and their sources'
        cross caches, each giving its ``candidates`` best tokens and its greedy token."""
        ...
