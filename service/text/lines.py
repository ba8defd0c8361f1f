"""A text's form: leading and trailing whitespace, lines and empty lines, kept exactly around the pieces that are
translated."""

from __future__ import annotations

import re
from dataclasses import dataclass

_EDGES = re.compile(r"^(\s*)(.*?)(\s*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Layout:
    """A text cut into the stretches to translate and the whitespace between them.

    Attributes:
        pieces: the text's parts in order; odd indices are stretches to translate, even ones whitespace kept as
            it is (possibly empty).
    """

    pieces: list[str]

    @property
    def stretches(self) -> list[str]:
        """The stretches to translate, in order."""
        return self.pieces[1::2]

    @property
    def starts(self) -> list[int]:
        """Where each stretch starts in the text (a character index)."""
        out, at = [], 0
        for i, piece in enumerate(self.pieces):
            if i % 2:
                out.append(at)
            at += len(piece)
        return out

    def join(self, translations: list[str]) -> str:
        """The text with each stretch replaced by its translation, whitespace unchanged."""
        out = list(self.pieces)
        out[1::2] = translations
        return "".join(out)


def layout(text: str) -> Layout:
    """Cut ``text`` at its line breaks and around each line's edge whitespace: an empty or whitespace-only text
    has no stretch at all."""
    pieces = [""]
    for line in re.split(r"(\r\n|\n|\r)", text):
        if line in ("\r\n", "\n", "\r"):
            pieces[-1] += line
            continue
        lead, body, trail = _EDGES.match(line).groups()  # type: ignore[union-attr]  # the pattern matches any line
        pieces[-1] += lead
        if body:
            pieces += [body, trail]
        else:
            pieces[-1] += trail
    return Layout(pieces)
