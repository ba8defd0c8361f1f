"""Repetition loops: a stretch of the translation said three times or more in a row, or one letter or ideograph said
four times or more, where the source repeats nothing so. The engine decodes a looping output again with a
repetition guard (service/serving/unlooping.py) and flags what still loops in ``return_details``."""

from __future__ import annotations

import re

# A unit of 2 to 20 characters, at least two different ones (a rule of dashes or dots is no loop), 3 times or more.
LOOP = re.compile(r"(.{2,20}?)\1{2,}")
# One letter or ideograph (no digit, "_" or punctuation: "1000", "____" and "!!!!" are no loops), 4 times or more.
RUN = re.compile(r"([^\W\d_])\1{3,}")


def loops(text: str) -> list[str]:
    """The units that ``text`` (whitespace aside) repeats: stretches three times or more in a row, single letters or
    ideographs four times or more."""
    joined = "".join(text.split())
    units = [m.group(1) for m in LOOP.finditer(joined) if len(set(m.group(1))) > 1]
    return units + [m.group(1) for m in RUN.finditer(joined)]


def has_loop(source: str, translation: str) -> bool:
    """Whether ``translation`` loops where ``source`` does not."""
    return bool(loops(translation)) and not loops(source)
