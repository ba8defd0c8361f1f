"""Protected spans: the parts of a text that must come back exactly as they are (format placeholders, markers,
URLs, e-mail addresses, entities, inline tags, characters the vocabulary lacks), found, masked and restored.

Finding is pattern matching on a plain string (the HTML format parses markup with a real parser and hands its
inline tags here as text); placing a span in the translation is service/text/placement.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

# One alternation, most specific first: the first alternative that matches at a position wins.
PATTERNS: dict[str, str] = {
    "printf": r"%(?:\d+\$)?(?:\([A-Za-z_][A-Za-z0-9_]*\))?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?[diouxXeEfFgGaAcsSpn%@]",
    "brace": r"\{\{[^{}\s]*\}\}|\{[A-Za-z0-9_.:!\[\]-]*\}",
    "marker": r"\[X\d+X\]",
    # A positional parameter ("$1": HexChat's, a shell's): models drop the "$" and run its digits into a neighbour's.
    "positional": r"\$\d+(?!\d|[.,]\d)",
    "url": r"\b(?:https?|ftp|file)://[^\s<>\"']*[^\s<>\"'.,;:!?)\]]",
    "email": r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
    "entity": r"&(?:[A-Za-z][A-Za-z0-9]{1,31}|#\d{1,7}|#[xX][0-9A-Fa-f]{1,6});",
    "tag": r"</?[A-Za-z][A-Za-z0-9:_-]*"
    r"(?:\s+[A-Za-z_:][-A-Za-z0-9_:.]*(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+))?)*\s*/?>",
    # A number ("60", "1.5", "2,000", "2010-07-18", "12:30", the "2" of "2nd": an ordinal's suffix is the model's to
    # translate): the model loses and invents numbers it reads, and keeps them masked (docs/BENCHMARKS.md).
    "number": r"(?<![A-Za-z\d_])\d+(?:[.,:/-]\d+)*(?=(?:st|nd|rd|th)?(?![A-Za-z\d_]))",
    # A word with digits in it ("mp3", "x86_64", "3D", "v1.2"): a code or a name, kept as written.
    "code": r"(?<![A-Za-z\d_])(?=[A-Za-z_]*\d)[A-Za-z\d_]+(?:[.,]\d+)*(?![A-Za-z\d_])",
}
SPANS = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in PATTERNS.items()))
DIGIT_KINDS = frozenset({"number", "code"})  # TextPipeline.numbers False leaves them to the model
WITHOUT_NUMBERS = re.compile("|".join(f"(?P<{k}>{p})" for k, p in PATTERNS.items() if k not in DIGIT_KINDS))
DIGITS = re.compile(r"\d+")
FORMAT_KINDS = frozenset({"printf", "brace", "marker", "positional"})  # a program formats them: losing one breaks it


@dataclass(frozen=True, slots=True)
class Span:
    """A protected stretch of a source text.

    Attributes:
        start, end: its characters in the source text.
        kind: a key of :data:`PATTERNS`, ``"char"`` (characters the vocabulary lacks), ``"glossary"`` or ``"keep"``.
        output: what the translation gets in its place: the source text itself, or a glossary's target term.
    """

    start: int
    end: int
    kind: str
    output: str


def find_spans(
    text: str,
    vocabulary: Collection[str] = (),
    glossary: Mapping[str, str] | None = None,
    keep: Iterable[str] = (),
    numbers: bool = True,
    inside: Callable[[str], Collection[int]] | None = None,
) -> list[Span]:
    """Every protected span of ``text``, in order and without overlaps.

    Args:
        text: one line of source text.
        vocabulary: the characters the tokenizer's pieces contain; others are protected (empty: none are).
        glossary: source term → target term, matched as whole words, case-sensitively.
        keep: terms copied verbatim, matched as glossary terms are.
        numbers: numbers and words with digits are spans (``number``, ``code``); False leaves them to the model.
        inside: the offsets inside a word of a text, where a term must not start or end (service/text/words.py's
            ``cuts`` for the text's language); None: between two letters, digits or "_".

    Returns:
        The spans; where two overlap the earlier (then the longer) wins, terms before patterns.
    """
    found: list[Span] = []
    terms = {**{t: t for t in keep}, **(glossary or {})}
    cut: Collection[int] | None = None  # offsets inside a word, found once a term occurs
    for term in sorted(terms, key=len, reverse=True):
        if not term:
            continue
        kind = "glossary" if glossary and term in glossary else "keep"
        start = text.find(term)
        while start >= 0:
            cut = (inside or _inside_words)(text) if cut is None else cut
            if start not in cut and start + len(term) not in cut:
                found.append(Span(start, start + len(term), kind, terms[term]))
            start = text.find(term, start + 1)
    for m in (SPANS if numbers else WITHOUT_NUMBERS).finditer(text):
        kind = m.lastgroup or "tag"
        found.append(Span(m.start(), m.end(), kind, m.group()))
    if numbers:  # digits that no pattern took whole ("%C24": "24" after a conversion)
        found.extend(Span(m.start(), m.end(), "number", m.group()) for m in DIGITS.finditer(text))
    if vocabulary:
        found.extend(_unknown_chars(text, vocabulary))
    return _without_overlaps(found)


def _inside_words(text: str) -> frozenset[int]:
    """The offsets between two word characters (letters, digits, "_")."""
    word = [c.isalnum() or c == "_" for c in text]
    return frozenset(i for i in range(1, len(text)) if word[i - 1] and word[i])


def _unknown_chars(text: str, vocabulary: Collection[str]) -> list[Span]:
    """Runs of characters the vocabulary lacks (they would decode as bytes, or as U+FFFD), whitespace aside."""
    out: list[Span] = []
    start = None
    for i, c in enumerate(text):
        unknown = c not in vocabulary and not c.isspace()
        if unknown and start is None:
            start = i
        elif not unknown and start is not None:
            out.append(Span(start, i, "char", text[start:i]))
            start = None
    if start is not None:
        out.append(Span(start, len(text), "char", text[start:]))
    return out


def _without_overlaps(spans: list[Span]) -> list[Span]:
    """Terms were added first: a stable sort by start keeps them ahead of a pattern starting at the same place."""
    out: list[Span] = []
    for span in sorted(spans, key=lambda s: (s.start, -(s.end - s.start))):
        if out and span.start < out[-1].end:
            continue
        out.append(span)
    return out


def has_spans(text: str, vocabulary: Collection[str] = (), numbers: bool = True) -> bool:
    """Whether ``text`` has a pattern span (a number, unless ``numbers`` is False) or a character outside
    ``vocabulary``: the cheap test that keeps plain texts on the fast path."""
    if (SPANS if numbers else WITHOUT_NUMBERS).search(text) is not None or (numbers and DIGITS.search(text)):
        return True
    return bool(vocabulary) and not set(text).issubset(vocabulary)


@dataclass(frozen=True, slots=True)
class Masked:
    """A source text with each group of adjacent spans replaced by a numbered stand-in, ``{0}``, ``{1}``, ...

    Attributes:
        text: the text the model decodes.
        outputs: each group's text in the translation, in source order.
        ordered: per group, whether it must keep its order among the other ordered groups (printf conversions
            without an argument index, and tags, which must nest as they did).
    """

    text: str
    outputs: list[str]
    ordered: list[bool]


def stand_in(i: int) -> str:
    """The stand-in of group ``i``: a numbered brace placeholder, which the model copies like the ones it saw."""
    return "{" + str(i) + "}"


def mask(text: str, spans: list[Span]) -> Masked:
    """Replace each run of touching spans by one stand-in."""
    parts: list[str] = []
    outputs: list[str] = []
    ordered: list[bool] = []
    last = 0
    for span in spans:
        if outputs and span.start == last:  # touches the previous span: the same group
            outputs[-1] += span.output
            ordered[-1] = ordered[-1] or _ordered(span)
        else:
            parts += [text[last : span.start], stand_in(len(outputs))]
            outputs.append(span.output)
            ordered.append(_ordered(span))
        last = span.end
    parts.append(text[last:])
    return Masked("".join(parts), outputs, ordered)


def _ordered(span: Span) -> bool:
    return span.kind == "tag" or (span.kind == "printf" and "$" not in span.output and "(" not in span.output)
