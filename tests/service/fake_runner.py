"""A runner without a model, for decoder and scheduler tests: subclasses give ``spec`` and ``step``."""

from __future__ import annotations

import numpy as np

from service.bundle import GraphForm, ModelSpec
from service.decoding import StepRunner
from service.runner import EncoderOutput, StepOutput
from service.tensors import Cache, HostTensors

APPENDED = GraphForm("decoder", attentions=True, cache="appended")  # as decoder.onnx
IN_PLACE = GraphForm("decoder", attentions=False, cache="in_place", grouped_cross=True)  # as decoder.int8.onnx


class FakeRunner:
    """``encode`` keeps each source's first token and length in its cross keys ([b, 0, 0, 0] and [b, 0, 0, 1]
    after the decoder gathered row b's text); ``step_rows`` is for ``step`` to record each decoder call's batch
    size. ``form``: the decoder graph's (appended caches with a self-attention mask, by default)."""

    spec: ModelSpec
    tensors = HostTensors()
    form = APPENDED

    def __init__(self) -> None:
        self.step_rows: list[int] = []

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        B, S = input_ids.shape
        keys = np.zeros((B, 2, S, 2), np.float32)
        keys[:, 0, :, 0] = input_ids  # at each text's first position, its first token
        same_text = attention_mask[:, :, None] == attention_mask[:, None, :]
        keys[:, 0, :, 1] = (same_text & (attention_mask[:, None, :] != 0)).sum(2)  # and its length
        return EncoderOutput(np.zeros((1, B, 2, S, S), np.float32), [keys], [keys.copy()])

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
        raise NotImplementedError("a test's runner gives its step")


def _typed(runner: FakeRunner) -> StepRunner:
    return runner  # mypy: a FakeRunner is a StepRunner
