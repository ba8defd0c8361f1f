"""Spans put back into decoded segments, checked, and recovered where the result is broken.

After the first decode each hypothesis' spans go where the model copied their stand-ins, and by cross-attention
where it did not. The restored text is checked (service/text/verify.py), first with the spans the model did not copy
at the end: a text broken before any span is placed by attention is recovered without that attention (a full pass
of the exact graphs). A segment whose text is broken is recovered in steps, the first whose every hypothesis comes
out whole answering:

1. ``constrained``: decoded again with a search that emits each stand-in exactly once and no number of its own
   (service/decoding/constraint.py);
2. ``attention``: the first decode's text with its broken stand-ins and made-up numbers cut out, every span placed
   where the model copied its stand-in or by cross-attention;
3. ``appended``: that text with every span appended at the end, in source order.

A pair whose model breaks most stand-ins decodes its segments with spans constrained from the start
(service/serving/constrained_first.py): such a segment answers ``constrained`` where that decode is whole, and is
otherwise decoded unconstrained and recovered from step 2. A segment that needed no recovery answered ``decoded``.

The engine runs :func:`restore_spans` as part of its steps, for /translate and for /attention alike
(service/serving/explain.py): it yields requests to decode or a function to call off the event loop. A request that
collects attention rows gets them from its constrained re-decode too.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import numpy as np

from service.decoding import DecodeRequest, DecodeResult, Hypothesis
from service.serving.steps import Step
from service.text.pipeline import Prepared, Segment, TextPipeline

PATHS = ("decoded", "constrained", "attention", "appended")  # in the order they are tried


class ForcingRunner(Protocol):
    """A runner that gives finished hypotheses' cross-attention in one call (service/runtime/runner.py's
    :class:`~service.runtime.runner.AppendedRunner`, with the forced decoder)."""

    def cross_attention(self, sources: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class Restored:
    """Per segment, its hypotheses' texts (best first) and the path of its best one (None: it has no span)."""

    texts: list[list[str]]
    paths: list[str | None]


def worst(paths: list[str | None]) -> str | None:
    """The latest of ``paths`` in :data:`PATHS`' order (one text's, from its segments'); None if none has spans."""
    found = [p for p in paths if p is not None]
    return max(found, key=PATHS.index) if found else None


def restore_spans(
    text: TextPipeline,
    forced: ForcingRunner | None,
    prepared: Prepared,
    requests: list[DecodeRequest],
    results: list[DecodeResult],
) -> Generator[Step, list[DecodeResult], Restored]:
    """Every segment's texts, restored, checked and recovered; ``results`` gets a segment's constrained result
    where that answered (its details are then that decode's). A segment whose request came constrained (the pair's
    :class:`~service.serving.constrained_first.ConstrainedFirst`) answers with that decode where it is whole, and
    otherwise decodes unconstrained (``requests`` gets that request) and recovers as any other, the constrained step
    left out."""
    segments = prepared.segments
    texts = placed(text, prepared, requests, results).texts  # spans the model did not copy at the end
    paths: list[str | None] = ["decoded" if s.masked is not None else None for s in segments]
    first = [i for i, r in enumerate(requests) if r.constraint is not None]
    if first:
        failed = yield from _checked(text, forced, segments, requests, results, texts, first)
        for i in first:
            paths[i] = "decoded" if i in failed else "constrained"
        if failed:
            plain = [replace(requests[i], constraint=None) for i in failed]
            redone = yield plain
            for i, request, result in zip(failed, plain, redone, strict=True):
                requests[i], results[i] = request, result
                texts[i] = [text.restored(segments[i], request.src, h) for h in result.hypotheses]
    todo = [i for i in range(len(segments)) if paths[i] != "constrained"]
    broken = yield from _checked(text, forced, segments, requests, results, texts, todo)
    if not broken:
        return Restored(texts, paths)
    tries = [(i, c) for i in broken if i not in first and (c := text.constraint(segments[i])) is not None]
    again_requests = [replace(requests[i], constraint=c) for i, c in tries]
    redone = (yield again_requests) if tries else []
    tried = [segments[i] for i, _ in tries]  # a stand-in the constraint spelled in pieces is placed by attention
    yield from attend(
        forced, again_requests, redone, list(range(len(tries))), lambda k, h: text.needs_attention(tried[k], h)
    )
    for (i, _), result in zip(tries, redone, strict=True):
        again = [text.restored(segments[i], requests[i].src, h) for h in result.hypotheses]
        if again and not any(text.problems(segments[i], t) for t in again):
            texts[i], results[i], paths[i] = again, result, "constrained"
    left = [i for i in broken if paths[i] == "decoded"]
    yield from attend(forced, requests, results, left, lambda i, h: not h.cross_attention)
    for i in left:
        texts[i], paths[i] = recovered(text, segments[i], requests[i].src, results[i].hypotheses)
    return Restored(texts, paths)


def _checked(
    text: TextPipeline,
    forced: ForcingRunner | None,
    segments: list[Segment],
    requests: list[DecodeRequest],
    results: list[DecodeResult],
    texts: list[list[str]],
    which: list[int],
) -> Generator[Step, list[DecodeResult], list[int]]:
    """The segments of ``which`` whose texts are broken: checked with the spans the model did not copy at the end,
    then the whole ones' such spans placed by cross-attention (their ``texts`` restored again) and checked again."""
    broken = [i for i in which if _broken(text, segments[i], texts[i])]
    needing = [i for i in which if i not in broken and any(
        text.needs_attention(segments[i], h) for h in results[i].hypotheses)]  # fmt: skip
    yield from attend(forced, requests, results, needing, lambda i, h: text.needs_attention(segments[i], h))
    for i in needing:
        texts[i] = [text.restored(segments[i], requests[i].src, h) for h in results[i].hypotheses]
    return sorted({*broken, *(i for i in needing if _broken(text, segments[i], texts[i]))})


def _broken(text: TextPipeline, segment: Segment, texts: list[str]) -> bool:
    return any(text.problems(segment, t) for t in texts)


def placed(
    text: TextPipeline, prepared: Prepared, requests: list[DecodeRequest], results: list[DecodeResult]
) -> Restored:
    """Every segment's texts with its spans placed, neither checked nor recovered (no path): what a forced target
    gives, the caller's text being the answer."""
    segments = prepared.segments
    texts = [[text.restored(s, requests[i].src, h) for h in results[i].hypotheses] for i, s in enumerate(segments)]
    return Restored(texts, [None] * len(segments))


def recovered(text: TextPipeline, segment: Segment, src: list[int], hyps: list[Hypothesis]) -> tuple[list[str], str]:
    """A broken segment's texts without a new decode: each hypothesis' own text where whole, else cleaned and placed
    by attention, else cleaned with its spans appended; and the best hypothesis' path."""
    texts, path = [], "decoded"
    for k, hyp in enumerate(hyps):
        t, p = text.restored(segment, src, hyp), "decoded"
        if text.problems(segment, t):
            t, p = text.restored(segment, src, hyp, clean=True), "attention"
        if text.problems(segment, t):
            t, p = text.appended(segment, hyp), "appended"
        texts.append(t)
        path = p if k == 0 else path
    return texts, path


def attend(
    forced: ForcingRunner | None,
    requests: list[DecodeRequest],
    results: list[DecodeResult],
    which: list[int],
    needs: Callable[[int, Hypothesis], bool],
) -> Generator[Step, list[DecodeResult], None]:
    """Cross-attention for the hypotheses of segments ``which`` that ``needs`` it: from one forced-decoder call on
    the exact graphs (their tokens kept), or without a forced decoder by decoding those segments again with
    attention rows."""
    which = [i for i in which if any(needs(i, h) for h in results[i].hypotheses)]
    if not which:
        return
    if forced is not None:
        hyps = [(requests[i], h) for i in which for h in results[i].hypotheses if needs(i, h)]
        if hyps:
            yield partial(_attach, forced, hyps)
        return
    redone = yield [replace(requests[i], attention=True) for i in which]
    for i, result in zip(which, redone, strict=True):
        results[i] = result


def _attach(forced: ForcingRunner, hyps: list[tuple[DecodeRequest, Hypothesis]]) -> None:
    """The hypotheses' cross-attention from one forced-decoder call, their requests' target prefix decoded first
    and its steps left out, as decoding leaves them out."""
    rows = forced.cross_attention([r.src for r, _ in hyps], [[*r.prefix, *h.tokens] for r, h in hyps])
    for (request, hyp), weights in zip(hyps, rows, strict=True):
        hyp.cross_attention = list(weights[len(request.prefix) :])  # per step (L, h, S)
