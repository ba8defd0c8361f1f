"""What the engine takes and gives, apart from how it decodes: a request's options and attention filters, its
translations with their details, /attention's result, and the checks and joins around them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from service.errors import InvalidText
from service.runtime.bundle import unencodable
from service.serving.alignment import Alignable
from service.serving.unlooping import GUARD, Guard

KINDS = ("encoder", "decoder", "cross")
Gone = Callable[[], Awaitable[bool]]  # whether the caller went away (Starlette's Request.is_disconnected)


@dataclass(frozen=True)
class Options:
    """Decoding options of one request.

    Args:
        beam_size: 1 = greedy; None: the pair's default (settings' ``decoding``).
        max_length: generated tokens at most; default min(settings.max_length, 2 × source tokens + 10).
        alternatives: extra translations wanted; the beam widens to at least alternatives + 1.
        length_penalty: finished beam hypotheses rank by score / length^length_penalty; None: the pair's default.
        details: add tokens, scores and a cross-attention alignment to each translation.
        glossary: source term → target term, enforced where a term occurs (service/text/).
        keep: terms copied verbatim.
        raw: each text goes to the model as given, whole: no layout, sentence split, span masking, glossary or guard.
        guard: how an output that loops is decoded again (service/serving/unlooping.py); None: never.
        alignments: give each translation the cross-attention its word alignments are read from.
    """

    beam_size: int | None = None
    max_length: int | None = None
    alternatives: int = 0
    length_penalty: float | None = None
    details: bool = False
    glossary: Mapping[str, str] | None = None
    keep: tuple[str, ...] = ()
    raw: bool = False
    guard: Guard | None = GUARD
    alignments: bool = False

    def defaulted(self, beam_size: int | None, length_penalty: float | None) -> Options:
        """These options with an unset ``beam_size`` or ``length_penalty`` set to the one given (None: left unset)."""
        return replace(
            self,
            beam_size=beam_size if self.beam_size is None else self.beam_size,
            length_penalty=length_penalty if self.length_penalty is None else self.length_penalty,
        )


@dataclass(frozen=True)
class Filters:
    """Which attention weights to return: kinds (subset of :data:`KINDS`), layer and head indices (None = all)."""

    kinds: Sequence[str] = KINDS
    layers: list[int] | None = None
    heads: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Details:
    """One translation's tokens, log-probabilities (six decimals) and word alignment: each target token's most
    attended source token, last layer, heads averaged; each source token's coverage (the most attention any step
    gave it, service/serving/confidence.py), the calibrated confidence and the flags; ``spans``, for a text with
    protected spans, the latest path that restored a sentence's spans (service/serving/restoring.py's ``PATHS``)."""

    source_tokens: list[str]
    tokens: list[str]
    score: float
    token_scores: list[float]
    alignment: list[int]
    coverage: list[float] = field(default_factory=list)
    confidence: float | None = None
    flags: list[str] = field(default_factory=list)
    spans: str | None = None


@dataclass(frozen=True, slots=True)
class Hop:
    """One hop of a translation through a pivot language: its pair, the text it gave and, if asked, its details."""

    source: str
    target: str
    text: str
    details: Details | None


@dataclass(frozen=True, slots=True)
class Translation:
    """One text's translation, its alternatives (texts that read differently, best first) and, if asked, details
    and what its word alignments are read from (``alignable``); through a pivot language, its ``hops`` in order (each
    with its own details) and neither details nor alignments of its own."""

    text: str
    alternatives: list[str]
    details: Details | None
    hops: tuple[Hop, ...] = ()
    alignable: Alignable | None = None


@dataclass(frozen=True)
class SegmentAttention:
    """One decoded segment of an /attention text (a line or sentence, as /translate cuts it) with its weights,
    [layer][head][query][key] per kind, rounded to six decimals.

    Query t of decoder and cross attention is the step that produced ``target_tokens[t]`` from
    ``decoder_input_tokens[P + t]``, P the length of the bundle's target prefix (usually 0); decoder self-attention
    is 0 right of key P + t.

    Attributes:
        source: the characters of the text that the segment translates, ``text[start:end]``.
        target: the characters of the translation that are its translation.
        model_input: what the model read: the segment with each group of protected spans replaced by its stand-in.
        spans: for a segment with protected spans, the path that restored them (service/serving/restoring.py's
            ``PATHS``); None without spans and for a forced target (neither checked nor recovered).
    """

    source: tuple[int, int]
    target: tuple[int, int]
    model_input: str
    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    weights: dict[str, npt.NDArray[np.float64]]
    spans: str | None = None


@dataclass(frozen=True)
class AttentionResult:
    """A text's translation, as /translate gives it, with each of its segments' attention weights.

    Attributes:
        text: the translation.
        heads: the heads returned (the same for every kind and segment).
        layers: per kind, in the order asked, the layers returned.
        segments: in the text's order.
        alignable: what its word alignments are read from, if asked.
    """

    text: str
    heads: list[int]
    layers: dict[str, list[int]]
    segments: list[SegmentAttention]
    alignable: Alignable | None = None


def check_unicode(texts: Sequence[str]) -> None:
    """Refuse a text that is not valid Unicode before anything copies it through into an answer.

    Raises:
        InvalidText: an unpaired surrogate (field ``q``).
    """
    for text in texts:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidText(unencodable(text, "q"), "q") from e


def distinct(texts: list[str], n: int) -> list[str]:
    """Up to n of ``texts[1:]`` (hypotheses' texts, best first) that differ from ``texts[0]`` and from each other:
    hypotheses whose pieces differ can read the same, and an alternative that repeats a text tells nothing."""
    seen = {texts[0]}
    out: list[str] = []
    for text in texts[1:]:
        if len(out) == n:
            break
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def join_details(parts: list[Details]) -> Details | None:
    """One text's details from its segments': tokens concatenated, alignment indices into the joined source
    tokens; None for a text that decoded nothing (empty or whitespace)."""
    if not parts:
        return None
    source: list[str] = []
    alignment: list[int] = []
    for d in parts:
        alignment += [a + len(source) for a in d.alignment]
        source += d.source_tokens
    return Details(
        source_tokens=source,
        tokens=[t for d in parts for t in d.tokens],
        score=round(sum(d.score for d in parts), 6),
        token_scores=[x for d in parts for x in d.token_scores],
        alignment=alignment,
        coverage=[c for d in parts for c in d.coverage],
    )


def translation_strings(t: Translation) -> list[str]:
    return [t.text, *t.alternatives]


def cache_key(options: Options) -> Hashable:
    """What of a request's options its translations depend on (``details`` answers are not cached)."""
    glossary = tuple(sorted(options.glossary.items())) if options.glossary else None
    o = options
    return (o.beam_size, o.max_length, o.alternatives, o.length_penalty, glossary, o.keep, o.raw, o.guard)
