"""Word alignments from cross-attention: which words of a text and of its translation translate each other, as
character spans of both.

A text's segments were decoded from model inputs (the segment with its protected spans' stand-ins), and their
translations restored into the returned text. Each source piece is placed in the request text through SentencePiece's
offsets into the model input and a character diff of the model input against the segment; each target piece in the
returned translation through the offsets SentencePiece decodes it with and a diff of that text against the segment's
restored translation (a copied stand-in lands on the span that replaced it). Words are service/text/words.py's.

The rule (:data:`DEFAULT`, chosen on dev by bench/alignment.py, docs/BENCHMARKS.md "Word alignments"): the last
decoder layer's cross-attention, heads averaged, summed into a (target word, source word) weight; a pair is linked
where each is the other's heaviest word (both directions agree), which keeps the one-to-one links and drops the
target words that only lean on a source word another word owns.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from service.errors import NoSuchIndex
from service.runtime.bundle import Tokenizer
from service.text.words import words

Span = tuple[int, int]
Link = tuple[Span, Span]  # (source span, target span)


Method = Literal["pieces", "words", "agreed"]
METHODS: tuple[Method, ...] = ("pieces", "words", "agreed")


@dataclass(frozen=True)
class Rule:
    """Which cross-attention aligns, and how.

    Attributes:
        layer: a decoder layer; negative counts from the last.
        heads: the heads averaged; None: all.
        shift: a target piece's row is the step that read it (the next step), else the step that produced it.
        method: ``"pieces"``, each target piece linked to its most attended source piece (their words linked);
            ``"words"``, each target word to the source word with the most of its pieces' weight (a word's weight
            the sum over its pieces); ``"agreed"``, the ``"words"`` links whose source word also gives that target
            word more weight than any other (its pieces' mean), the two directions agreeing.
    """

    layer: int
    heads: tuple[int, ...] | None
    shift: bool
    method: Method


DEFAULT = Rule(layer=-1, heads=None, shift=False, method="agreed")
BASELINE = Rule(layer=-1, heads=None, shift=False, method="pieces")  # the last layer's argmax, as details' alignment


@dataclass(frozen=True)
class SegmentInput:
    """One decoded segment, as the engine or /attention has it.

    Attributes:
        source: its characters in the request text.
        target: its characters in the returned translation.
        model_input: what the model read (the segment with its stand-ins).
        target_pieces: the pieces decoded, one a row of ``cross``.
        cross: (T, L, h, S) cross-attention, one row a target piece, its keys the source ids.
    """

    source: Span
    target: Span
    model_input: str
    target_pieces: list[str]
    cross: npt.NDArray[np.floating]


@dataclass(frozen=True)
class _Segment:
    sources: list[list[int]]  # per source id (column), the source words it covers
    targets: list[list[int]]  # per target piece (row), the target words it covers
    cross: npt.NDArray[np.float32]  # (T, L, h, S)


@dataclass(frozen=True)
class Alignable:
    """A text's words on both sides and its segments' cross-attention, aligned by :meth:`links` under a rule."""

    source_words: list[Span]
    target_words: list[Span]
    segments: list[_Segment]
    layers: int
    heads: int

    def check(self, rule: Rule) -> None:
        """Raises NoSuchIndex for a layer or head the model does not have."""
        if not -self.layers <= rule.layer < self.layers:
            raise NoSuchIndex(
                f"alignment_layer {rule.layer} does not exist: the decoder has layers 0..{self.layers - 1}"
            )
        bad = [h for h in rule.heads or () if not 0 <= h < self.heads]
        if bad:
            raise NoSuchIndex(f"alignment_heads {bad} do not exist: the model has heads 0..{self.heads - 1}")

    def links(self, rule: Rule = DEFAULT) -> list[Link]:
        """The word pairs, ordered by source then target span.

        Raises:
            NoSuchIndex: as :meth:`check`.
        """
        self.check(rule)
        pairs: set[tuple[int, int]] = set()
        for seg in self.segments:
            pairs |= _pairs(seg, rule)
        return sorted((self.source_words[s], self.target_words[t]) for s, t in pairs)


def _pairs(seg: _Segment, rule: Rule) -> set[tuple[int, int]]:
    """(source word, target word) index pairs of one segment."""
    a = seg.cross[:, rule.layer]  # (T, h, S)
    a = a.mean(axis=1) if rule.heads is None else a[:, list(rule.heads)].mean(axis=1)  # (T, S)
    if rule.shift:
        a = np.concatenate([a[1:], a[-1:]])  # row t: the step that read piece t (the last piece has none after it)
    content = [j for j, w in enumerate(seg.sources) if w]
    if not content or not any(seg.targets):
        return set()
    if rule.method == "pieces":
        out: set[tuple[int, int]] = set()
        for t, tw in enumerate(seg.targets):
            best = content[int(a[t, content].argmax())]
            out |= {(s, w) for s in seg.sources[best] for w in tw}
        return out
    sw, to_source = _membership(seg.sources)  # (S, source words)
    tw, to_target = _membership(seg.targets)  # (T, target words)
    mass = to_target.T @ a @ to_source  # (target words, source words)
    forward = {(sw[int(mass[i].argmax())], tw[i]) for i in range(len(tw))}
    if rule.method == "words":
        return forward
    mean = mass / to_target.sum(axis=0)[:, None]
    backward = {(sw[j], tw[int(mean[:, j].argmax())]) for j in range(len(sw))}
    return forward & backward


def _membership(pieces: list[list[int]]) -> tuple[list[int], npt.NDArray[np.float64]]:
    """The words that pieces cover, and a (pieces, words) 0/1 matrix of which piece covers which."""
    found = sorted({w for ws in pieces for w in ws})
    index = {w: k for k, w in enumerate(found)}
    out = np.zeros((len(pieces), len(found)))
    for j, ws in enumerate(pieces):
        for w in ws:
            out[j, index[w]] = 1.0
    return found, out


def alignable(
    tokenizer: Tokenizer,
    langs: tuple[str, str],
    text: str,
    translation: str,
    segments: Sequence[SegmentInput],
    shape: tuple[int, int],
) -> Alignable:
    """A text's :class:`Alignable`.

    Args:
        tokenizer: the bundle's.
        langs: (source language, target language), for their word rules.
        text: the request text.
        translation: the returned translation.
        segments: the text's decoded segments.
        shape: the model's (decoder layers, heads).
    """
    source_words, target_words = words(text, langs[0]), words(translation, langs[1])
    out = []
    special = set(tokenizer.pieces(sorted(tokenizer.special)))
    for seg in segments:
        S = seg.cross.shape[-1]
        spans = _source_spans(tokenizer, seg.model_input, text[seg.source[0] : seg.source[1]], S)
        sources = [_covered(source_words, _shifted(s, seg.source[0])) for s in spans]
        restored = translation[seg.target[0] : seg.target[1]]
        spans = _target_spans(tokenizer, seg.target_pieces, special, restored)
        targets = [_covered(target_words, _shifted(s, seg.target[0])) for s in spans]
        out.append(_Segment(sources, targets, np.asarray(seg.cross, np.float32)))
    return Alignable(source_words, target_words, out, shape[0], shape[1])


def _shifted(span: Span | None, by: int) -> Span | None:
    return None if span is None else (span[0] + by, span[1] + by)


def _covered(word_spans: list[Span], span: Span | None) -> list[int]:
    """The words that ``span`` overlaps."""
    if span is None or span[0] >= span[1]:
        return []
    return [k for k, (a, b) in enumerate(word_spans) if a < span[1] and span[0] < b]


def _source_spans(tokenizer: Tokenizer, model_input: str, segment: str, columns: int) -> list[Span | None]:
    """Per source id (``columns`` of them: the engine's and the tokenizer's prefix, the pieces, the suffix), its
    characters in ``segment``; None for the ids around the pieces."""
    proto = tokenizer.source.encode(model_input, return_type="proto")
    spans = _piece_spans(model_input, [(p.begin, p.end) for p in proto.pieces])
    where = _char_map(model_input, segment)
    placed = [_mapped(where, s) for s in spans]
    lead = columns - len(placed) - len(tokenizer.source_suffix)
    return [None] * lead + placed + [None] * (columns - lead - len(placed))


def _target_spans(tokenizer: Tokenizer, pieces: list[str], special: set[str], restored: str) -> list[Span | None]:
    """Per target piece, its characters in the segment's restored translation; None for </s> and padding."""
    content = [p for p in pieces if p not in special]
    proto = tokenizer.target.decode(content, return_type="proto") if content else None
    spans = [] if proto is None else _piece_spans(proto.text, [(p.begin, p.end) for p in proto.pieces])
    where = _char_map("" if proto is None else proto.text, restored)
    it = iter(_mapped(where, s) for s in spans)
    return [None if p in special else next(it) for p in pieces]


def _piece_spans(text: str, byte_spans: list[tuple[int, int]]) -> list[Span]:
    """SentencePiece's byte offsets as character offsets; a byte piece that ends inside a character takes the
    character that its last byte completes."""
    char_at = np.cumsum([0, *(len(c.encode()) for c in text)])  # character k starts at byte char_at[k]
    spans = [(int(np.searchsorted(char_at, b)), int(np.searchsorted(char_at, e))) for b, e in byte_spans]
    following: Span | None = None
    for k in range(len(spans) - 1, -1, -1):
        if spans[k][0] == spans[k][1] and following is not None:
            spans[k] = following
        following = spans[k]
    return spans


def _char_map(model: str, user: str) -> list[Span]:
    """Per character of ``model``, the characters of ``user`` it became: itself where the texts agree, the whole
    replacement where a stretch was replaced (a stand-in and its span), nothing where it was dropped."""
    out: list[Span] = [(0, 0)] * len(model)
    matcher = difflib.SequenceMatcher(None, model, user, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        for i in range(i1, i2):
            out[i] = (j1 + i - i1, j1 + i - i1 + 1) if op == "equal" else (j1, j2) if op == "replace" else (j1, j1)
    return out


def _mapped(where: list[Span], span: Span) -> Span | None:
    chars = [where[i] for i in range(span[0], min(span[1], len(where))) if where[i][0] < where[i][1]]
    return (min(a for a, _ in chars), max(b for _, b in chars)) if chars else None
