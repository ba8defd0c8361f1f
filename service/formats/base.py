"""What every file format's translation shares: the text translator it is handed, batching, and the line-by-line
treatment that keeps a text's form."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping

from service.errors import TooLarge

# Texts in, one translation each out, in order; None for a text the service refuses (over a limit).
Translate = Callable[[list[str]], Awaitable[list[str | None]]]
TranslateBatch = Callable[[list[str]], Awaitable[list[str]]]  # raises TooLarge when a text is over a limit

_LINE_RE = re.compile(r"(\s*)(.*?)(\s*)", re.DOTALL)


def _parts(line: str) -> tuple[str, str, str]:
    match = _LINE_RE.fullmatch(line)
    assert match is not None  # every string matches
    return match.group(1), match.group(2), match.group(3)


def cores(text: str) -> list[str]:
    """The texts to translate in ``text``: each line without its surrounding whitespace, empty lines left out."""
    return [core for line in text.split("\n") if (core := _parts(line)[1])]


def rebuild(text: str, translations: Mapping[str, str | None]) -> str:
    """``text`` with each line's core replaced by its translation (kept where it has none), every newline and
    every line's surrounding whitespace kept exactly, as gettext's checks and readers expect."""
    out = []
    for line in text.split("\n"):
        before, core, after = _parts(line)
        translated = translations.get(core) if core else None
        out.append(before + (core if translated is None else translated.strip()) + after)
    return "\n".join(out)


async def translate_units(texts: Iterable[str], translate: Translate) -> dict[str, str | None]:
    """Every line core of ``texts`` translated once (catalogs and files repeat strings): core → translation."""
    units = list(dict.fromkeys(core for text in texts for core in cores(text)))
    return dict(zip(units, await translate(units), strict=True)) if units else {}


def batched(call: TranslateBatch, size: int, progress: Callable[[int], object] | None = None) -> Translate:
    """A :data:`Translate` that sends ``call`` batches of at most ``size`` texts, one after another.

    A batch refused as too large is sent again text by text, so that one over-long text (None in the answer) does
    not cost the others their translation. ``progress`` gets each batch's number of texts once it is done.
    """

    async def one(text: str) -> str | None:
        try:
            return (await call([text]))[0]
        except TooLarge:
            return None

    async def translate(texts: list[str]) -> list[str | None]:
        out: list[str | None] = []
        for start in range(0, len(texts), size):
            batch = texts[start : start + size]
            try:
                out.extend(await call(batch))
            except TooLarge:
                out.extend([await one(text) for text in batch])
            if progress is not None:
                progress(len(batch))
        return out

    return translate
