"""Constrained search: a row may emit each numbered stand-in ``{0}`` … ``{n-1}`` once, and must emit every one
before </s>.

The constraint reads the text that the tokens spell, character by character, so any tokenization of a stand-in is
accepted (``{0}`` as one piece, or ``▁{``, ``1``, ``2``, ``}``). Outside a stand-in no brace is allowed and, unless
the constraint allows them, no digit: a number the source does not have cannot be made up. A row's state is two
integers (:data:`OUTSIDE` or the digits read since ``{``; a bit mask of the stand-ins emitted), kept in
:class:`~service.decoding.rows.Rows` so that beam search carries it with its hypotheses. Which tokens a state allows
depends only on the stand-ins' count and whether digits are free, so the vocabulary's :class:`Spelling` keeps it for
every request of its pair.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

OUTSIDE = -1  # not in a stand-in; 0: just after "{"; v + 1: after the digits of v
_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
KEPT = 256  # the states a Spelling keeps the allowed tokens of; beyond, the oldest go


@dataclass(frozen=True)
class Allowed:
    """The tokens a row in one state may emit: ``tokens`` are those allowed where ``keep``, else those forbidden
    (whichever is fewer)."""

    size: int
    tokens: npt.NDArray[np.int32]
    keep: bool

    @classmethod
    def of(cls, mask: npt.NDArray[np.bool_]) -> Allowed:
        allowed, forbidden = np.flatnonzero(mask), np.flatnonzero(~mask)
        keep = len(allowed) <= len(forbidden)
        return cls(len(mask), (allowed if keep else forbidden).astype(np.int32), keep)

    def mask(self) -> npt.NDArray[np.bool_]:
        """(V,) bool: True where allowed."""
        out = np.full(self.size, not self.keep)
        out[self.tokens] = self.keep
        return out

    def apply(self, logits: npt.NDArray[np.float32]) -> None:
        """One row's logits (V,), in place: the forbidden tokens' set to -inf."""
        if self.keep:
            kept = logits[self.tokens]
            logits.fill(-np.inf)
            logits[self.tokens] = kept
        else:
            logits[self.tokens] = -np.inf


class Spelling:
    """What the constraint reads of a target vocabulary: the text of every token with a brace or a digit.

    Args:
        pieces: the vocabulary's pieces, by id (SentencePiece's: ``▁`` a space, ``<0xNN>`` a byte).
        eos_id: </s>, allowed once every stand-in is out.
    """

    def __init__(self, pieces: Sequence[str], eos_id: int) -> None:
        self.size = len(pieces)
        self.eos_id = eos_id
        self.texts: dict[int, str] = {}
        for i, piece in enumerate(pieces):
            text = piece_text(piece)
            if any(c in "{}" or c.isdigit() for c in text):
                self.texts[i] = text
        self.kept: dict[tuple[int, bool, int, int], Allowed] = {}  # (count, digits, state, done) -> its tokens
        self.keeping = threading.Lock()  # decoding threads of the pair add to ``kept`` side by side


def piece_text(piece: str) -> str:
    """A piece's characters (``▁`` a space); a byte piece is its character when the byte is one (ASCII), else
    nothing to read."""
    if m := _BYTE.fullmatch(piece):
        byte = int(m.group(1), 16)
        return chr(byte) if byte < 0x80 else ""
    return piece.replace("▁", " ")


class StandIns:
    """Each of the stand-ins ``{0}`` … ``{count - 1}`` exactly once, no other brace, and digits outside them only
    if ``digits``.

    Args:
        spelling: the target vocabulary's (:class:`Spelling`), shared by every request of a pair.
        count: the stand-ins of the source, at most 62.
        digits: digits allowed outside stand-ins (the source has a number of its own).
    """

    def __init__(self, spelling: Spelling, count: int, digits: bool) -> None:
        if not 0 <= count <= 62:
            raise ValueError(f"a constraint holds at most 62 stand-ins, not {count}")
        self.spelling, self.count, self.digits = spelling, count, digits
        self.full = (1 << count) - 1

    def advance(self, state: int, done: int, token: int) -> tuple[int, int] | None:
        """The state after ``token``, or None where the token breaks the constraint."""
        text = self.spelling.texts.get(token)
        if text is None:  # no brace and no digit: plain text, welcome anywhere but inside a stand-in
            return (state, done) if state == OUTSIDE else None
        for c in text:
            step = self._char(state, done, c)
            if step is None:
                return None
            state, done = step
        return state, done

    def _char(self, state: int, done: int, c: str) -> tuple[int, int] | None:
        if state == OUTSIDE:
            if c == "{":
                return (0, done) if done != self.full else None
            if c == "}" or (c.isdigit() and not self.digits):
                return None
            return state, done
        if c == "}":
            n = state - 1
            return (OUTSIDE, done | 1 << n) if state > 0 and not done >> n & 1 else None
        if not "0" <= c <= "9" or state == 1:  # a number has no leading zero: "0" is complete
            return None
        value = (state - 1) * 10 + int(c) if state else int(c)
        prefix = str(value)
        if not any(not done >> n & 1 and str(n).startswith(prefix) for n in range(self.count)):
            return None
        return value + 1, done

    def allowed(self, state: int, done: int) -> Allowed:
        """Which tokens a row in this state may emit next; every token where none could (the verification after
        decoding then sees the result). Kept in the spelling, shared by the pair's requests and decoding threads."""
        key, kept = (self.count, self.digits, state, done), self.spelling.kept
        if (found := kept.get(key)) is not None:
            return found
        mask = np.full(self.spelling.size, state == OUTSIDE)
        for token in self.spelling.texts:
            mask[token] = self.advance(state, done, token) is not None
        mask[self.spelling.eos_id] = state == OUTSIDE and done == self.full
        if not mask.any():
            mask[:] = True
        allowed = Allowed.of(mask)
        with self.spelling.keeping:
            if len(kept) >= KEPT:
                del kept[next(iter(kept))]
            kept[key] = allowed
        return allowed
