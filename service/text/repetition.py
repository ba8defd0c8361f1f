"""Repetition loops: a stretch of the translation said three times or more in a row, where the source repeats
nothing so. Flagged in ``return_details``."""

from __future__ import annotations

import re

# A unit of 2 to 20 characters, at least two different ones (a rule of dashes or dots is no loop), 3 times or more.
LOOP = re.compile(r"(.{2,20}?)\1{2,}")


def loops(text: str) -> list[str]:
    """The units that ``text`` (whitespace aside) repeats three times or more in a row."""
    joined = "".join(text.split())
    return [m.group(1) for m in LOOP.finditer(joined) if len(set(m.group(1))) > 1]


def has_loop(source: str, translation: str) -> bool:
    """Whether ``translation`` loops where ``source`` does not."""
    return bool(loops(translation)) and not loops(source)
