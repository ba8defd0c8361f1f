"""Texts around decoding: each text cut into the sentences to decode (its whitespace, lines and empty lines kept),
their protected spans and glossary terms masked, and after decoding the translations put back together with every
span placed where the model copied its stand-in, or by cross-attention.

The engine calls :meth:`TextPipeline.prepare` before decoding and :meth:`Prepared.finish` after it; a request
whose texts are all plain gets None from ``prepare`` and decodes as it always did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from service.decoding import Hypothesis
from service.decoding.constraint import Spelling, StandIns
from service.runtime.bundle import Tokenizer
from service.text.lines import Layout, layout
from service.text.placement import DEFAULT, Aggregation, copied, in_order, positions, restore
from service.text.sentences import sentences
from service.text.spans import Masked, find_spans, has_spans, mask
from service.text.verify import STAND_IN, cleaned, numbers, problems


@dataclass(frozen=True, slots=True)
class Segment:
    """One sentence to decode: its masked source, or ``masked`` None when it has no span."""

    source: str
    masked: Masked | None
    plain: bool = False  # the whole text, decoded as the fast path decodes it (the same answer in any request)


@dataclass
class Prepared:
    """A request's texts as segments to decode, and how to put each text back together.

    Attributes:
        segments: every text's segments, in order, decoded together in one call.
        layouts: per text, its layout; each stretch has ``counts[i]`` segments, each segment its edge whitespace.
        offsets: per segment, the characters of its text that it translates (``text[start:end]``, before masking).
    """

    segments: list[Segment] = field(default_factory=list)
    layouts: list[Layout] = field(default_factory=list)
    parts: list[list[list[tuple[str, str]]]] = field(default_factory=list)  # text → stretch → (lead, trail)
    offsets: list[tuple[int, int]] = field(default_factory=list)

    def add_plain(self, text: str) -> None:
        """Add a text that decodes whole, as the fast path decodes it."""
        self.segments.append(Segment(text, None, plain=True))
        self.layouts.append(Layout(["", text, ""]))
        self.parts.append([[("", "")]])
        self.offsets.append((0, len(text)))

    def ranges(self) -> list[range]:
        """Per text, the indices of its segments in :attr:`segments`."""
        out, start = [], 0
        for stretches in self.parts:
            n = sum(len(st) for st in stretches)
            out.append(range(start, start + n))
            start += n
        return out

    def finish(self, outputs: list[list[str]], alternatives: int) -> list[tuple[str, list[str]]]:
        """Each text's translation and alternatives from its segments' texts (best first).

        Args:
            outputs: per segment, its hypotheses' restored texts, best first.
            alternatives: alternatives wanted per text.
        """
        it = iter(outputs)
        out = []
        for lay, stretches in zip(self.layouts, self.parts, strict=True):
            texts = [[next(it) for _ in stretch] for stretch in stretches]
            versions = []
            for k in range(alternatives + 1):
                joined = [_joined(st, hs, k) for st, hs in zip(stretches, texts, strict=True)]
                versions.append(lay.join(joined))
            out.append((versions[0], versions))
        return out

    def placed(self, outputs: list[str]) -> list[list[tuple[int, int]]]:
        """Per text, where each of its segments' texts stands in the translation that :meth:`finish` joins from
        ``outputs`` (one text a segment): ``translation[start:end]`` is the segment's text."""
        it = iter(outputs)
        out = []
        for lay, stretches in zip(self.layouts, self.parts, strict=True):
            places = []
            at = 0
            for k, stretch in enumerate(stretches):
                at += len(lay.pieces[2 * k])  # the whitespace before the stretch
                for lead, trail in stretch:
                    n = len(next(it))
                    places.append((at + len(lead), at + len(lead) + n))
                    at += len(lead) + n + len(trail)
            out.append(places)
        return out


def _joined(parts: list[tuple[str, str]], hypotheses: list[list[str]], k: int) -> str:
    """A stretch from its sentences' k-th texts (the best where a sentence has fewer), edge whitespace kept."""
    return "".join(
        lead + (h[k] if k < len(h) else h[0]) + trail for (lead, trail), h in zip(parts, hypotheses, strict=True)
    )


class TextPipeline:
    """One pair's text handling: its tokenizer's characters, its glossary file's terms and the settings' limits.

    Args:
        tokenizer: the bundle's; characters outside its pieces are protected spans.
        language: the source language (sentence rules).
        split_chars: lines longer than this are cut into sentences.
        glossary: the pair's glossary file (source term → target term), merged under a request's own.
        aggregation: how cross-attention places spans.
        spelling: the target vocabulary as the constrained search reads it (None: no constrained re-decoding).
        numbers: numbers are protected spans (service/text/spans.py).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        language: str,
        split_chars: int,
        glossary: Mapping[str, str] | None = None,
        aggregation: Aggregation = DEFAULT,
        spelling: Spelling | None = None,
        numbers: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.language = language
        self.split_chars = split_chars
        self.glossary = dict(glossary or {})
        self.aggregation = aggregation
        self.spelling = spelling
        self.numbers = numbers
        self.vocabulary = characters(tokenizer)

    def plain(self, text: str) -> bool:
        """Whether ``text`` decodes as it is: no edge whitespace, one line, short, no span."""
        return (
            bool(text)
            and not text[0].isspace()
            and not text[-1].isspace()
            and "\n" not in text
            and "\r" not in text
            and len(text) <= self.split_chars
            and not has_spans(text, self.vocabulary, self.numbers)
        )

    def prepare(
        self, texts: Sequence[str], glossary: Mapping[str, str] | None = None, keep: Sequence[str] = ()
    ) -> Prepared | None:
        """The texts' segments, or None when every text is plain and no glossary or kept term applies."""
        terms = {**self.glossary, **(glossary or {})}
        if not terms and not keep and all(self.plain(t) for t in texts):
            return None
        prepared = Prepared()
        for text in texts:
            if self.plain(text) and not keep and not any(t in text for t in terms):
                prepared.add_plain(text)
                continue
            lay = layout(text)
            stretches = []
            for stretch, at in zip(lay.stretches, lay.starts, strict=True):
                parts = []
                for sentence in sentences(stretch, self.language, self.split_chars):
                    body = sentence.strip()
                    lead = sentence[: len(sentence) - len(sentence.lstrip())]
                    trail = sentence[len(lead) + len(body) :]
                    spans = find_spans(body, self.vocabulary, terms, keep, self.numbers)
                    masked = mask(body, spans) if spans else None
                    prepared.segments.append(Segment(masked.text if masked else body, masked))
                    prepared.offsets.append((at + len(lead), at + len(lead) + len(body)))
                    parts.append((lead, trail))
                    at += len(sentence)
                stretches.append(parts)
            prepared.layouts.append(lay)
            prepared.parts.append(stretches)
        return prepared

    def segmented(
        self, text: str, glossary: Mapping[str, str] | None = None, keep: Sequence[str] = (), raw: bool = False
    ) -> Prepared:
        """One text as :meth:`prepare` cuts it for /translate, a plain text as one segment; ``raw``: the whole text
        as one segment, as given (no layout, sentence, span or glossary)."""
        prepared = None if raw else self.prepare([text], glossary, keep)
        if prepared is None:
            prepared = Prepared()
            prepared.add_plain(text)
        return prepared

    def needs_attention(self, segment: Segment, hyp: Hypothesis) -> bool:
        """Whether placing the segment's spans in this hypothesis needs cross-attention it lacks: the model did not
        copy every stand-in."""
        if segment.masked is None or hyp.cross_attention:
            return False
        tok = self.tokenizer
        return None in copied(segment.masked, tok.pieces([t for t in hyp.tokens if t not in tok.special]))

    def restored(self, segment: Segment, src: list[int], hyp: Hypothesis, clean: bool = False) -> str:
        """One hypothesis' text, with the segment's spans put back where the model copied their stand-ins, and
        where cross-attention places those it did not copy; ``clean``: the model's own text stripped of broken
        stand-ins and made-up numbers (service/text/verify.py's ``cleaned``)."""
        tok = self.tokenizer
        tokens = [t for t in hyp.tokens if t not in tok.special]
        if segment.plain:
            return tok.decode(hyp.tokens)
        if (masked := segment.masked) is None:
            return _one_line(tok.decode(hyp.tokens))
        pieces = tok.pieces(tokens)
        places = copied(masked, pieces)
        if None in places and hyp.cross_attention:
            weights = self.aggregation.apply(np.stack(hyp.cross_attention))
            read = positions(masked, tok.pieces(src), weights, len(tokens))
            places = [c if c is not None else r for c, r in zip(places, read, strict=True)]
        strip = partial(cleaned, masked=masked) if clean else None
        return _one_line(restore(masked, pieces, in_order(masked, places), _detokenizer(tok), strip))

    def appended(self, segment: Segment, hyp: Hypothesis) -> str:
        """The last resort: the model's own text, cleaned, with every span group appended in source order."""
        masked = segment.masked
        assert masked is not None
        pieces = self.tokenizer.pieces([t for t in hyp.tokens if t not in self.tokenizer.special])
        strip = partial(cleaned, masked=masked)
        return _one_line(restore(masked, pieces, [None] * len(masked.outputs), _detokenizer(self.tokenizer), strip))

    def problems(self, segment: Segment, text: str) -> list[str]:
        """What keeps ``text`` (a restored translation of ``segment``) from being whole (service/text/verify.py)."""
        return [] if segment.masked is None else problems(segment.masked, text)

    def constraint(self, segment: Segment) -> StandIns | None:
        """The constrained search that re-decodes a segment whose translation is broken: each stand-in once, and
        digits only where the source has a number of its own; None without a spelling or with too many groups."""
        masked = segment.masked
        if self.spelling is None or masked is None or len(masked.outputs) > 62:
            return None
        digits = bool(numbers(STAND_IN.sub(" ", masked.text)))
        return StandIns(self.spelling, len(masked.outputs), digits)


def _one_line(text: str) -> str:
    """A segment's translation within its line: the layout alone decides where lines break."""
    return " ".join(text.split()) if "\n" in text or "\r" in text else text.strip()


def characters(tokenizer: Tokenizer) -> frozenset[str]:
    """The characters of the source vocabulary's pieces (byte and control pieces aside): others are spans."""
    sp = getattr(tokenizer, "source", None)  # a tokenizer without a SentencePiece model protects no character
    if sp is None:
        return frozenset()
    pieces = (sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_byte(i) and not sp.is_control(i))
    return frozenset(c for p in pieces for c in p if c != "▁") | {" ", "\t"}  # spaces are word boundaries (▁)


def _detokenizer(tok: Tokenizer) -> Callable[[list[str]], str]:
    def detokenize(pieces: list[str]) -> str:
        return str(tok.target.decode_pieces(pieces))

    return detokenize
