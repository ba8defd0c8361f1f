"""Outputs that loop, decoded again: a text (or segment) whose best hypothesis repeats itself where its source does
not (service/text/repetition.py) is decoded once more under a repetition guard, and takes that decode's hypotheses
where they no longer loop. Every other output stays as the model decoded it, so the parity with other decoders holds
there; what still loops is flagged in ``return_details``."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

from service.decoding import DecodeRequest, DecodeResult
from service.serving.steps import Step
from service.text.repetition import has_loop


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


def unlooped(
    guard: Guard,
    decoded: Callable[[list[int]], str],
    sources: list[str],
    requests: list[DecodeRequest],
    results: list[DecodeResult],
) -> Generator[Step, list[DecodeResult], None]:
    """Decode again, under ``guard``, the requests whose best hypothesis (its text: ``decoded(tokens)``) loops where
    its source text does not; ``results`` takes each new result that no longer loops."""
    looping = [i for i, r in enumerate(results) if has_loop(sources[i], decoded(r.hypotheses[0].tokens))]
    if not looping:
        return
    redone = yield [guard.applied(requests[i]) for i in looping]
    for i, result in zip(looping, redone, strict=True):
        if not has_loop(sources[i], decoded(result.hypotheses[0].tokens)):
            results[i] = result
