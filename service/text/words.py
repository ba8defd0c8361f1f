"""Words of a text, as character offsets: the unit that a rule must not cut (a glossary term matches whole words).

Languages written without spaces between words get a well-kept segmenter where one is installed (MeCab through
fugashi with the unidic-lite dictionary for Japanese, jieba for Chinese: the ``words`` extra), else runs of one
script (Japanese kanji, hiragana and katakana apart; Thai, Chinese without jieba: a whole run is one word). Other
languages: runs of letters, digits and combining marks.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from collections.abc import Callable
from functools import cache

Segmenter = Callable[[str], list[tuple[int, int]]]

UNSPACED = frozenset({"ja", "zh", "th", "lo", "km", "my", "bo"})  # written without spaces between words
WORD = re.compile(r"[\w\u0300-\u036f]+")  # (Unicode letters and digits, "_", Latin combining accents)
_LOCK = threading.Lock()  # MeCab's and jieba's objects are not made for concurrent calls


def words(text: str, lang: str) -> list[tuple[int, int]]:
    """The words of ``text`` in language ``lang`` ("ja", "zh-Hant", "de", ...), in order, as (start, end) offsets
    into ``text``; whitespace and punctuation belong to no word."""
    base = re.split(r"[-_]", lang, maxsplit=1)[0].lower()
    if base in UNSPACED:
        segment = segmenter(base)
        return segment(text) if segment is not None else script_runs(text)
    return [(m.start(), m.end()) for m in WORD.finditer(text)]


def cuts(text: str, lang: str) -> frozenset[int]:
    """The offsets inside a word of ``text`` (neither its start nor its end): where a match would cut one."""
    return frozenset(p for start, end in words(text, lang) for p in range(start + 1, end))


def script_runs(text: str) -> list[tuple[int, int]]:
    """Runs of letters (or digits) of one script, combining marks with the letter they follow."""
    out: list[tuple[int, int]] = []
    start, current = 0, None
    for i, c in enumerate(text):
        s = script(c)
        if s == "MARK" and current is not None:
            continue
        if s != current:
            if current is not None:
                out.append((start, i))
            start, current = i, None if s == "MARK" else s
    if current is not None:
        out.append((start, len(text)))
    return out


def script(c: str) -> str | None:
    """The script of a letter or digit (``MARK`` for a combining mark), None for anything else."""
    category = unicodedata.category(c)
    if category[0] == "M":
        return "MARK"
    if category[0] == "N":
        return "DIGIT"
    if category[0] != "L":
        return None
    name = unicodedata.name(c, "").split(" ")
    first = name[1] if name[0] in ("FULLWIDTH", "HALFWIDTH") and len(name) > 1 else name[0]
    if first in ("CJK", "IDEOGRAPHIC"):  # kanji, hanzi, the iteration mark 々
        return "HAN"
    return "KATAKANA" if first == "KATAKANA-HIRAGANA" else first  # the prolonged sound mark ー goes with katakana


@cache
def segmenter(lang: str) -> Segmenter | None:
    """The installed segmenter of an unspaced language, None where none is installed."""
    try:
        if lang == "ja":
            return _mecab()
        if lang == "zh":
            return _jieba()
    except ImportError:
        return None
    return None


def _mecab() -> Segmenter:
    import fugashi  # the ``words`` extra, with unidic-lite (its default dictionary)

    tagger = fugashi.Tagger()

    def segment(text: str) -> list[tuple[int, int]]:
        with _LOCK:
            surfaces = [w.surface for w in tagger(text)]
        return _located(text, surfaces)

    return segment


def _jieba() -> Segmenter:
    import jieba  # the ``words`` extra

    jieba.setLogLevel(logging.WARNING)  # its dictionary loads with a line on stderr
    tokenizer = jieba.Tokenizer()

    def segment(text: str) -> list[tuple[int, int]]:
        with _LOCK:
            found = list(tokenizer.tokenize(text))
        return [(start, end) for w, start, end in found if WORD.search(w)]

    return segment


def _located(text: str, surfaces: list[str]) -> list[tuple[int, int]]:
    """The offsets of ``surfaces``, found in order in ``text``; those without a letter or digit left out."""
    out, at = [], 0
    for surface in surfaces:
        start = text.find(surface, at)
        if start < 0:
            continue
        at = start + len(surface)
        if WORD.search(surface):
            out.append((start, at))
    return out
