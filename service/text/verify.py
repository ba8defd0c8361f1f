"""Whether a translation with its spans restored is whole: every span as often as in the source, no stand-in or
piece of one left, the tags in the source's order (so nested as they were), and the source's numbers, none lost and
none made up.

The engine checks every restored text (service/serving/restoring.py) and recovers a broken one.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

from service.text.spans import PATTERNS, Masked

STAND_IN = re.compile(r"\{\d+\}")
# What a stand-in leaves when the model breaks it: a brace with a word glued in ("{lgreset}"), a brace with its
# digits ("{4", "7}"), or a lone brace.
FRAGMENT = re.compile(r"\{[^{}\s]*\}|\{\d*|\d*\}")
TAG = re.compile(PATTERNS["tag"])
NUMBER = re.compile(r"\d+")  # every run of digits, inside words too

PROBLEMS = ("spans", "fragments", "tags", "numbers")


def problems(masked: Masked, text: str) -> list[str]:
    """What is wrong with ``text``, the restored translation of ``masked`` (an empty list: it is whole).

    Returns:
        Names from :data:`PROBLEMS`: ``spans`` (a span more or less often than in the source), ``fragments`` (a
        brace the source's own text does not have: a stand-in or a piece of one), ``tags`` (tags not as the
        source's, in order), ``numbers`` (the numbers outside spans differ from the source's).
    """
    source = STAND_IN.sub(" ", masked.text)  # the source's own text, spans out
    rest = residual(text, masked.outputs)
    out = []
    joined = "\0".join(masked.outputs)
    if any(text.count(s) != joined.count(s) for s in set(masked.outputs)):
        out.append("spans")
    if rest.count("{") > source.count("{") or rest.count("}") > source.count("}"):
        out.append("fragments")
    if TAG.findall(text) != TAG.findall(joined):
        out.append("tags")
    if numbers(rest) != numbers(source):
        out.append("numbers")
    return out


def residual(text: str, outputs: list[str]) -> str:
    """``text`` with every occurrence of the spans' texts cut out (longest first), each leaving a space."""
    for s in sorted(set(outputs), key=len, reverse=True):
        if s:
            text = text.replace(s, " ")
    return text


def numbers(text: str) -> Counter[str]:
    """The numbers in ``text``, full-width digits read as ASCII."""
    return Counter(NUMBER.findall(unicodedata.normalize("NFKC", text)))


def cleaned(text: str, masked: Masked) -> str:
    """The model's own text stripped of what :func:`problems` would find in it: stand-ins and their pieces, the
    spans' texts (they go back separately), and numbers the source's own text does not have."""
    text = FRAGMENT.sub("", STAND_IN.sub("", residual(text, masked.outputs)))
    have = numbers(STAND_IN.sub(" ", masked.text))
    text = NUMBER.sub(lambda m: m.group() if have[unicodedata.normalize("NFKC", m.group())] else "", text)
    return re.sub(r"(?<=\S)  +(?=\S)", " ", text)  # where a cut left two spaces
