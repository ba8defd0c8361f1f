"""An answer's work as steps: a generator that yields requests to decode (and is sent their results) or a function
to call off the event loop (and is sent ``[]``), and returns the answer. /translate's and /attention's work take
this form (service/serving/engine.py, restoring.py, explain.py), so a scheduler or a direct decode carries either."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Sequence
from functools import partial
from typing import TypeVar

from service.decoding import DecodeRequest, DecodeResult

# A step of an answer's work: requests to decode, or a function to call off the event loop.
Step = list[DecodeRequest] | Callable[[], object]
R = TypeVar("R")  # the answer


async def carried(
    steps: Generator[Step, list[DecodeResult], R], queue: Callable[[list[DecodeRequest]], Awaitable[list[DecodeResult]]]
) -> R:
    """The answer of ``steps``, their requests sent through ``queue`` and their functions run on a worker thread."""
    step = next(steps)
    while True:
        if isinstance(step, list):
            sent = await queue(step)
        else:
            await asyncio.to_thread(step)
            sent = []
        try:
            step = steps.send(sent)
        except StopIteration as done:
            answer: R = done.value  # the generator's return value
            return answer


def carried_now(
    steps: Generator[Step, list[DecodeResult], R], decode: Callable[[list[DecodeRequest]], list[DecodeResult]]
) -> R:
    """The answer of ``steps`` in turn on this thread: their requests through ``decode``, their functions called."""
    step = next(steps)
    while True:
        if isinstance(step, list):
            sent = decode(step) if step else []
        else:
            step()
            sent = []
        try:
            step = steps.send(sent)
        except StopIteration as done:
            answer: R = done.value  # the generator's return value
            return answer


def together(
    answers: Sequence[Generator[Step, list[DecodeResult], R]],
) -> Generator[Step, list[DecodeResult], list[R]]:
    """Several answers' steps as one, in rounds: the functions that answers wait on called in one step, then the
    requests that they wait on decoded in one step (one batch), each answer sent its own results; the answers in
    order."""
    done: dict[int, R] = {}
    waiting: dict[int, Step] = {}

    def advance(i: int, sent: list[DecodeResult] | None) -> None:
        try:
            waiting[i] = next(answers[i]) if sent is None else answers[i].send(sent)
        except StopIteration as finished:
            done[i] = finished.value
            waiting.pop(i, None)

    for i in range(len(answers)):
        advance(i, None)
    while waiting:
        calls = {i: step for i, step in waiting.items() if not isinstance(step, list)}
        if calls:
            yield partial(_call_each, list(calls.values()))
            for i in calls:
                advance(i, [])
            continue
        asked = {i: step for i, step in waiting.items() if isinstance(step, list)}
        every = [r for step in asked.values() for r in step]
        results = (yield every) if every else []
        at = 0
        for i, step in asked.items():
            advance(i, results[at : at + len(step)])
            at += len(step)
    return [done[i] for i in range(len(answers))]


def _call_each(calls: list[Callable[[], object]]) -> None:
    for call in calls:
        call()
