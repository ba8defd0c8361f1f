"""Outputs that loop, decoded again under the repetition guard; every other output, and every output of a request
without the guard, as the model decoded it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from service.runtime.bundle import ModelSpec
from service.runtime.runner import StepInput, StepOutput
from service.serving.engine import Engine, Runners
from service.serving.translation import Options
from service.serving.unlooping import GUARD
from service.settings import Settings
from service.text.repetition import has_loop
from tests.service.fake_runner import SPEC, FakeRunner
from tests.service.serving.test_engine import Bundle, Tokenizer

Preferences = Callable[[int], dict[int, float]]  # step → logits of the tokens it prefers (others: -10)


class Letters(Tokenizer):
    """Token i reads as the letter chr(96 + i)."""

    def pieces(self, ids: list[int]) -> list[str]:
        return [chr(96 + i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces([i for i in ids if i != SPEC.eos_id]))


class Preferring(FakeRunner):
    """Each step's logits from ``preferences`` of its position, whatever the text."""

    spec: ModelSpec = SPEC
    attention = False
    provider = "fake"

    def __init__(self, preferences: Preferences) -> None:
        super().__init__()
        self.preferences = preferences

    def step(self, step: StepInput) -> StepOutput:
        B = step.input_ids.shape[0]
        logits = np.full((B, SPEC.vocab_size), -10.0, np.float32)
        for b, t in enumerate(step.position_ids[:, 0].tolist()):
            for token, value in self.preferences(t).items():
                logits[b, token] = value
        assert step.self_attention_mask is not None
        T = step.self_attention_mask.shape[1]
        kv = np.zeros((B, 2, T, 2), np.float32)
        attention = np.zeros((1, B, 2, step.cross_keys[0].shape[2]), np.float32)
        return StepOutput(logits, [kv], [kv.copy()], np.zeros((1, B, 2, T), np.float32), attention)


def engine(preferences: Preferences) -> Engine:
    runner = Preferring(preferences)
    return Engine(Bundle(tokenizer=Letters()), Settings(max_wait_ms=1, repetition_guard=True), Runners(runner, runner))  # type: ignore[arg-type]


def test_a_looping_output_is_decoded_again_under_the_guard() -> None:
    looping = engine(lambda t: {5: 2.0, SPEC.eos_id: 1.0})  # "e" ever more likely than </s>
    (raw,) = looping.translate_now(["Say it"], Options(guard=None))
    assert raw.text == "e" * 16 and has_loop("Say it", raw.text)
    (out,) = looping.translate_now(["Say it"], Options())
    assert out.text == "e" * GUARD.no_repeat_ngram_size and not has_loop("Say it", out.text)
    (details,) = looping.translate_now(["Say it"], Options(guard=None, details=True))
    assert details.details is not None and "repetition" in details.details.flags


def test_an_output_that_does_not_loop_is_the_model_s() -> None:
    plain = engine(lambda t: {3 + t: 2.0} if t < 3 else {SPEC.eos_id: 2.0})
    assert [t.text for t in plain.translate_now(["Say it"], Options())] == ["cde"]


def test_the_settings_turn_the_guard_off() -> None:
    runner = Preferring(lambda t: {5: 2.0, SPEC.eos_id: 1.0})
    off = Engine(Bundle(tokenizer=Letters()), Settings(repetition_guard=False), Runners(runner, runner))  # type: ignore[arg-type]
    assert [t.text for t in off.translate_now(["Say it"], Options())] == ["e" * 16]


def test_a_raw_text_gets_the_model_s_output_unguarded() -> None:
    looping = engine(lambda t: {5: 2.0, SPEC.eos_id: 1.0})
    assert [t.text for t in looping.translate_now(["Say it"], Options(raw=True))] == ["e" * 16]
