"""Where each masked span goes in the translation: where the model copied its stand-in, else read from
cross-attention.

A stand-in the model copied marks its span's place (the copy itself is dropped). A span whose stand-in it did not
copy goes before the target token whose cross-attention, aggregated over layers and heads as :class:`Aggregation`
says, puts the most weight on the stand-in in the source. docs/BENCHMARKS.md ("Protected spans") measures the
choice on dev.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from service.decoding.constraint import piece_text
from service.text.spans import Masked

_STAND_IN = re.compile(r"\{(\d+)\}")


@dataclass(frozen=True)
class Aggregation:
    """How cross-attention [T, L, h, S] becomes one [T, S] map.

    Attributes:
        layers: ``"last"`` (the last decoder layer) or ``"mean"`` (every layer's mean).
        head: one head's weights, or None for the heads' mean.
    """

    layers: str = "last"
    head: int | None = None

    def apply(self, cross: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        """[T, L, h, S] → [T, S]."""
        a = cross[:, -1] if self.layers == "last" else cross.mean(axis=1)  # (T, h, S)
        out = a.mean(axis=1) if self.head is None else a[:, self.head]
        return np.asarray(out, np.float64)


DEFAULT = Aggregation("last", None)


def piece_positions(pieces: list[str]) -> dict[int, list[int]]:
    """Stand-in number → the indices of the pieces that spell it (a stand-in may take several pieces, byte pieces
    among them)."""
    joined, owner = "", []
    for i, p in enumerate(pieces):
        text = piece_text(p)
        joined += text
        owner += [i] * len(text)
    out: dict[int, list[int]] = {}
    for m in _STAND_IN.finditer(joined):
        out.setdefault(int(m.group(1)), []).extend(sorted(set(owner[m.start() : m.end()])))
    return out


def positions(
    masked: Masked, source_pieces: list[str], weights: npt.NDArray[np.float64], n_target: int
) -> list[int | None]:
    """Each group's target index (it goes before that token; ``n_target`` = at the end), None where the source
    has no stand-in to read (the tokenizer merged it away) or there is no target token.

    Ordered groups keep their source order: their chosen indices are sorted among themselves.
    """
    source = piece_positions(source_pieces)
    out: list[int | None] = []
    for i in range(len(masked.outputs)):
        cols = source.get(i)
        if not cols or n_target == 0:
            out.append(None)
            continue
        mass = weights[:n_target, cols].sum(axis=1)
        out.append(int(mass.argmax()))
    return in_order(masked, out)


def in_order(masked: Masked, places: list[int | None]) -> list[int | None]:
    """``places`` with the ordered groups' places sorted among themselves, so they keep their source order."""
    out = list(places)
    ordered = [i for i, o in enumerate(masked.ordered) if o and out[i] is not None]
    for i, p in zip(ordered, sorted(out[i] for i in ordered), strict=True):  # type: ignore[type-var]
        out[i] = p
    return out


def restore(
    masked: Masked,
    target_pieces: list[str],
    places: list[int | None],
    detokenize: Callable[[list[str]], str],
    clean: Callable[[str], str] | None = None,
) -> str:
    """The translation with copied stand-ins dropped and each group's text put at its place; a group without a
    place is appended at the end, in source order.

    Args:
        masked: the masked source.
        target_pieces: the generated pieces, </s> excluded.
        places: from :func:`positions`.
        detokenize: pieces → text (the target tokenizer's).
        clean: applied to the model's own text between the groups (service/text/verify.py's ``cleaned``).
    """
    drop = {j for cols in piece_positions(target_pieces).values() for j in cols}
    at: dict[int, list[int]] = {}
    for i, p in enumerate(places):
        at.setdefault(len(target_pieces) if p is None else min(p, len(target_pieces)), []).append(i)
    out: list[str] = []
    chunk: list[str] = []
    for t in range(len(target_pieces) + 1):
        if t in at:
            out.append(_text(chunk, detokenize, bool(out), clean))
            boundary = t < len(target_pieces) and target_pieces[t].startswith("▁") and "".join(out).strip()
            out += [" " if boundary else "", *(masked.outputs[i] for i in sorted(at[t]))]  # the word's space
            chunk = []
        if t < len(target_pieces) and t not in drop:
            chunk.append(target_pieces[t])
    out.append(_text(chunk, detokenize, bool(out), clean))
    return "".join(out).strip()


def _text(
    pieces: list[str], detokenize: Callable[[list[str]], str], inner: bool, clean: Callable[[str], str] | None
) -> str:
    """A chunk's text; SentencePiece drops a chunk's leading word boundary, which inside the text is a space."""
    text = _STAND_IN.sub("", detokenize(pieces)).replace("\ufffd", "")  # bytes that spell no character
    text = clean(text) if clean is not None else text
    return " " + text if inner and pieces and pieces[0].startswith("▁") else text


def copied(masked: Masked, target_pieces: list[str]) -> list[int | None]:
    """Each group's place where the model copied its stand-in (its first copy), None where it did not."""
    found = piece_positions(target_pieces)
    return [found[i][0] if i in found else None for i in range(len(masked.outputs))]
