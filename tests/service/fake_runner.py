"""A runner without a model, for decoder and scheduler tests: subclasses give ``spec`` and ``step``."""

from __future__ import annotations

import numpy as np

from service.decoding import StepRunner
from service.runtime.bundle import GraphForm, ModelSpec
from service.runtime.runner import EncoderOutput, StepInput, StepOutput
from service.runtime.tensors import HostTensors

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

    def step(self, step: StepInput) -> StepOutput:
        raise NotImplementedError("a test's runner gives its step")


SPEC = ModelSpec(
    vocab_size=16, d_model=4, h=2, n_encoder_layers=1, n_decoder_layers=1, max_positions=64,
    pad_id=15, eos_id=0, unk_id=1, decoder_start_id=15,
)  # fmt: skip


class CountingRunner(FakeRunner):
    """Sequence i emits tokens src[0]+1, src[0]+2, ... and </s> after len(src) tokens."""

    spec = SPEC

    def step(self, step: StepInput) -> StepOutput:  # appended caches: never asked for tokens
        B = step.input_ids.shape[0]
        self.step_rows.append(B)
        cross_keys = step.cross_keys
        first, length = cross_keys[0][:, 0, 0, 0], cross_keys[0][:, 0, 0, 1]
        t = step.position_ids[:, 0] + 1
        nxt = np.where(t >= length, 0, (first + t) % 14 + 1).astype(int)
        logits = np.full((B, 16), -10.0, np.float32)
        logits[np.arange(B), nxt] = 10.0
        assert step.self_attention_mask is not None
        T = step.self_attention_mask.shape[1]
        kv = np.zeros((B, 2, T, 2), np.float32)
        return StepOutput(
            logits,
            [kv],
            [kv.copy()],
            np.zeros((1, B, 2, T), np.float32),
            np.zeros((1, B, 2, cross_keys[0].shape[2]), np.float32),
        )


def expected(src: list[int]) -> list[int]:
    return [(src[0] + t) % 14 + 1 for t in range(1, len(src))] + [0]


def _typed(runner: FakeRunner) -> StepRunner:
    return runner  # mypy: a FakeRunner is a StepRunner
