"""Answers' steps (service/serving/steps.py): several answers run as one, each sent its own results."""

from __future__ import annotations

from collections.abc import Generator

from service.decoding import DecodeRequest, DecodeResult, Hypothesis
from service.serving.steps import Step, carried_now, together


def request(n: int) -> DecodeRequest:
    return DecodeRequest(src=[n])


def answer(name: str, rounds: list[int], calls: list[str]) -> Generator[Step, list[DecodeResult], list[int]]:
    """Asks to decode ``n`` requests a round (0: a function call instead), and returns what it was sent."""
    got: list[int] = []
    for n in rounds:
        if n == 0:
            assert (yield lambda: calls.append(name)) == []
        else:
            sent = yield [request(100 * len(got) + i) for i in range(n)]
            got += [int(r.hypotheses[0].tokens[0]) for r in sent]
    return got


def test_together_batches_each_round_and_sends_each_answer_its_own_results() -> None:
    batches: list[int] = []

    def decode(requests: list[DecodeRequest]) -> list[DecodeResult]:
        batches.append(len(requests))
        return [DecodeResult([Hypothesis([r.src[0]], [0.0])], None) for r in requests]

    calls: list[str] = []
    answers = [answer("a", [2, 0, 1], calls), answer("b", [1], calls), answer("c", [0, 3], calls)]
    got = carried_now(together(answers), decode)
    assert got == [[0, 1, 200], [0], [0, 1, 2]]
    assert batches == [6, 1] and calls == ["c", "a"]  # the calls first, then every waiting request in one batch
