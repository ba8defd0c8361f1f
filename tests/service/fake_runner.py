"""A runner without a model, for decoder and scheduler tests: subclasses give ``spec`` and ``step``."""

from __future__ import annotations

import numpy as np

from service.runner import EncoderOutput, HostTensors


class FakeRunner:
    """``encode`` keeps each source's first token and length in its cross keys ([b, 0, 0, 0] and [b, 0, 0, 1]
    after the decoder gathered row b's text); ``step_rows`` is for ``step`` to record each decoder call's batch
    size."""

    tensors = HostTensors()
    in_place = False  # left-padded caches and a self-attention mask, as decoder.onnx
    grouped = False  # one source a row
    greedy_tokens = False  # logits only

    def __init__(self) -> None:
        self.step_rows: list[int] = []

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        B, S = input_ids.shape
        keys = np.zeros((B, 2, S, 2), np.float32)
        keys[:, 0, :, 0] = input_ids  # at each text's first position, its first token
        same_text = attention_mask[:, :, None] == attention_mask[:, None, :]
        keys[:, 0, :, 1] = (same_text & (attention_mask[:, None, :] != 0)).sum(2)  # and its length
        return EncoderOutput(np.zeros((1, B, 2, S, S), np.float32), [keys], [keys.copy()])
