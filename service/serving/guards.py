"""Outputs decoded again where they go wrong in ways the model's own text shows: a text (or segment) whose best
hypothesis loops where its source does not (service/text/repetition.py) is decoded once more under a repetition
guard; one whose source has no digit (so no span either) but whose output has some is decoded once more with a
constraint that forbids digits (a number the source does not have is made up). The new decode answers where it
has fewer of those faults. Every other output stays as the model decoded it, so the parity with other decoders holds
there; what still loops is flagged in ``return_details``. Segments with spans have their digits checked where their
spans are (service/serving/restoring.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

from service.decoding import DecodeRequest, DecodeResult
from service.decoding.constraint import Spelling, StandIns
from service.serving.steps import Step
from service.text.repetition import has_loop

DIGIT = re.compile(r"\d")
BRACE = re.compile(r"[{}]")  # the constraint that forbids digits forbids braces outside stand-ins too


@dataclass(frozen=True)
class Guard:
    """How a looping output is decoded again (docs/BENCHMARKS.md, "Whole outputs", measured the choice).

    Args:
        repetition_penalty: DecodeRequest's (1: none).
        no_repeat_ngram_size: DecodeRequest's (0: none).
        beam_size: the beam at least (1: the request's own).
    """

    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    beam_size: int = 1

    def applied(self, request: DecodeRequest) -> DecodeRequest:
        """``request`` under this guard."""
        return replace(
            request,
            repetition_penalty=self.repetition_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            beam_size=max(request.beam_size, self.beam_size),
        )


GUARD = Guard(no_repeat_ngram_size=3, beam_size=4)


def faults(source: str, text: str) -> frozenset[str]:
    """What is wrong with ``text``, a translation of ``source``: ``loop``, ``digits`` (it has digits, ``source``
    none)."""
    out = {"loop"} if has_loop(source, text) else set()
    if DIGIT.search(text) and not DIGIT.search(source):
        out.add("digits")
    return frozenset(out)


def guarded(
    guard: Guard,
    spelling: Spelling | None,
    decoded: Callable[[list[int]], str],
    sources: list[str],
    requests: list[DecodeRequest],
    results: list[DecodeResult],
) -> Generator[Step, list[DecodeResult], None]:
    """Decode again the requests whose best hypothesis (its text: ``decoded(tokens)``) has :func:`faults`: under
    ``guard`` where it loops, forbidding digits where it has some of its own (with a ``spelling`` to read them);
    ``results`` takes each new result with fewer faults."""
    found = {i: f for i, r in enumerate(results) if (f := faults(sources[i], decoded(r.hypotheses[0].tokens)))}
    if spelling is None:  # digits cannot be forbidden
        found = {i: f for i, f in found.items() if f != {"digits"}}
    found = {i: f for i, f in found.items() if f != {"digits"} or not BRACE.search(sources[i])}  # nor braces kept
    if not found:
        return
    again = []
    for i, fault in found.items():
        request = guard.applied(requests[i]) if "loop" in fault else requests[i]
        if "digits" in fault and spelling is not None and not BRACE.search(sources[i]):
            request = replace(request, constraint=StandIns(spelling, 0, digits=False))
        again.append(request)
    redone = yield again
    for (i, fault), result in zip(found.items(), redone, strict=True):
        if faults(sources[i], decoded(result.hypotheses[0].tokens)) < fault:
            results[i] = result
