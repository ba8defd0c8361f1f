"""Words of a text, as character spans: the unit of word alignments and of glossary matching.

Spaced languages: whitespace-separated words, with a run of punctuation at either edge a word of its own
("(hello)," is "(", "hello", "),"), so a word matches its bare form. Unspaced languages (ja, zh, th, ...): the
segmenter of the ``words`` extra where it is installed (MeCab with UniDic Lite for Japanese through fugashi, jieba for
Chinese, PyThaiNLP's newmm for Thai), else runs of one script ("東京タワーで" is "東京", "タワー", "で"). Whitespace
is never part of a word; the spans are in order and do not overlap. A protected span without whitespace
(service/text/spans.py: "%s", "{0}", a URL, an e-mail address, a number) is one word in every language.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections.abc import Callable, Iterator

from service.text.spans import SPANS

Segmenter = Callable[[str], list[str]]

# Written without spaces between words: a segmenter or script runs find their words.
UNSPACED = frozenset({"ja", "zh", "zt", "yue", "th", "lo", "km", "my", "bo", "dz"})
TOKEN = re.compile(r"\S+")


def words(text: str, lang: str) -> list[tuple[int, int]]:
    """The words of ``text`` as ``(start, end)`` character offsets, in order.

    Args:
        text: any text.
        lang: its language code ("en", "ja", "zh-Hant", ...); only the part before "-" counts.
    """
    code = lang.split("-")[0].lower()
    out: list[tuple[int, int]] = []
    at = 0
    for m in SPANS.finditer(text):
        if any(c.isspace() for c in m.group()):
            continue
        out += _plain_words(text, at, m.start(), code)
        out.append((m.start(), m.end()))
        at = m.end()
    return out + _plain_words(text, at, len(text), code)


def _plain_words(text: str, start: int, end: int, code: str) -> list[tuple[int, int]]:
    """The words of ``text[start:end]``, a stretch without protected spans."""
    if code not in UNSPACED:
        return [word for m in TOKEN.finditer(text, start, end) for word in _split_edges(text, m.start(), m.end())]
    part = text[start:end]
    segment = _segmenter(code)
    found = list(_script_runs(part)) if segment is None else _locate(part, segment(part)) if part.strip() else []
    return [(start + a, start + b) for a, b in found]


def segmenter_name(lang: str) -> str:
    """What finds ``lang``'s words: "whitespace", "script runs", or the segmenter's package ("fugashi", ...)."""
    code = lang.split("-")[0].lower()
    if code not in UNSPACED:
        return "whitespace"
    return SEGMENTERS[code][0] if code in SEGMENTERS and _segmenter(code) is not None else "script runs"


def _split_edges(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """A whitespace token's words: its leading punctuation, its core, its trailing punctuation."""
    first = start
    while first < end and _punctuation(text[first]):
        first += 1
    if first == end:
        yield (start, end)
        return
    last = end
    while _punctuation(text[last - 1]):
        last -= 1
    yield from ((a, b) for a, b in ((start, first), (first, last), (last, end)) if a < b)


def _punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def _script(char: str) -> str:
    """The class whose runs are words: a script's name, "digit", "punct", or "" for characters that join any run."""
    category = unicodedata.category(char)
    if category == "Nd":
        return "digit"
    if category.startswith("P"):
        return "punct"
    if category in ("Mn", "Mc", "Me", "Lm"):
        return ""  # combining marks and "ー" continue the word they follow
    name = unicodedata.name(char, "")
    return name.split(" ", 1)[0] if name else category


def _script_runs(text: str) -> Iterator[tuple[int, int]]:
    start, script = -1, ""
    for i, char in enumerate(text):
        current = "" if char.isspace() else _script(char)
        if start >= 0 and not char.isspace() and (not current or not script or current == script):
            script = script or current
            continue
        if start >= 0:
            yield (start, i)
        start, script = (-1, "") if char.isspace() else (i, current)
    if start >= 0:
        yield (start, len(text))


def _locate(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    """The segmenter's words as spans of ``text``; whatever it skipped or changed falls back to script runs."""
    out: list[tuple[int, int]] = []
    position = 0
    for piece in pieces:
        piece = piece.strip()
        found = text.find(piece, position) if piece else -1
        if found < 0:
            continue
        out.extend((position + a, position + b) for a, b in _script_runs(text[position:found]))
        out.append((found, found + len(piece)))
        position = found + len(piece)
    out.extend((position + a, position + b) for a, b in _script_runs(text[position:]))
    return out


def _mecab() -> Segmenter:
    import fugashi
    import unidic_lite

    directory = unidic_lite.DICDIR
    tagger = fugashi.GenericTagger(f'-r "{directory}/mecabrc" -d "{directory}"')
    return lambda text: [node.surface for node in tagger(text)]


def _jieba() -> Segmenter:
    import jieba

    jieba.setLogLevel(logging.WARNING)  # it logs its dictionary's loading at DEBUG to stderr
    tokenizer = jieba.Tokenizer()
    return lambda text: [word for word, _, _ in tokenizer.tokenize(text)]


def _pythainlp() -> Segmenter:
    from pythainlp.tokenize import word_tokenize

    return lambda text: list(word_tokenize(text, engine="newmm", keep_whitespace=False))


SEGMENTERS: dict[str, tuple[str, Callable[[], Segmenter]]] = {
    "ja": ("fugashi", _mecab),
    "zh": ("jieba", _jieba),
    "zt": ("jieba", _jieba),
    "yue": ("jieba", _jieba),
    "th": ("pythainlp", _pythainlp),
}


@functools.cache
def _segmenter(code: str) -> Segmenter | None:
    """``code``'s segmenter, loaded on first use; None where there is none or its package is not installed."""
    if code not in SEGMENTERS:
        return None
    try:
        return SEGMENTERS[code][1]()
    except ImportError:
        return None
