"""A runner without a model, for decoder and scheduler tests: subclasses give ``spec`` and ``step``."""

from __future__ import annotations

import numpy as np

from service.runner import EncoderOutput, HostTensors


class FakeRunner:
    """``encode`` keeps each source's first token and length in its cross keys ([b, 0, 0, 0] and [b, 0, 0, 1]);
    ``step_rows`` is for ``step`` to record each decoder call's batch size."""

    tensors = HostTensors()

    def __init__(self) -> None:
        self.step_rows: list[int] = []

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> EncoderOutput:
        B, S = input_ids.shape
        keys = np.zeros((B, 2, S, 2), np.float32)
        keys[:, 0, 0, 0] = input_ids[:, 0]
        keys[:, 0, 0, 1] = attention_mask.sum(1)
        return EncoderOutput(np.zeros((1, B, 2, S, S), np.float32), [keys], [keys.copy()])
