"""An answer's work as steps: a generator that yields requests to decode (and is sent their results) or a function
to call off the event loop (and is sent ``[]``), and returns the answer. /translate's and /attention's work take
this form (service/serving/engine.py, restoring.py, explain.py), so a scheduler or a direct decode carries either."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
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
