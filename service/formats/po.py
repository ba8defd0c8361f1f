"""Gettext catalogs (``.po``, ``.pot``): every empty msgstr filled, plural forms as the target language needs them,
everything else kept. polib reads and writes the catalog; babel's table gives a language's Plural-Forms.

The command line (``attnserve translate-po``) and ``POST /translate_file`` share :func:`translate_catalog`.
"""

from __future__ import annotations

import asyncio
import gettext
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import polib

from service.errors import UnreadableFile
from service.formats.base import Translate, cores, rebuild, translate_units
from service.formats.directives import keeps_directives

_NPLURALS_RE = re.compile(r"nplurals\s*=\s*(\d+)\s*;\s*plural\s*=\s*(.+?);?\s*$")
_CHARSET_RE = re.compile(r"charset=\s*([\w.:-]+)")


@dataclass(frozen=True)
class Plurals:
    """A language's plural forms: how many msgstr[n] an entry needs, and the one that serves n = 1 alone (None when
    the form n = 1 picks also serves other numbers, as Russian's serves 21)."""

    count: int
    singular: int | None

    @classmethod
    def of(cls, count: int, formula: Callable[[int], int]) -> Plurals:
        """The forms of a Plural-Forms formula, judged on 0..1000 as msgfmt judges them."""
        numbers: dict[int, set[int]] = {}
        for n in range(1001):
            numbers.setdefault(formula(n), set()).add(n)
        return cls(count, next((form for form, ns in numbers.items() if ns == {1}), None))

    def source(self, index: int, msgid: str, msgid_plural: str) -> str:
        """The English text that msgstr[index] translates: the singular for the form that serves n = 1 alone, the
        plural for every other (a form that serves several numbers needs the plural's directives)."""
        return msgid if index == self.singular else msgid_plural


@dataclass(frozen=True)
class Report:
    """What :func:`translate_catalog` did: msgstrs filled; of those, how many keep the English source because the
    translation lost a format directive, and how many keep a line in English because it was over a limit."""

    filled: int
    kept_source: int
    over_limit: int = 0


def parse(data: bytes) -> polib.POFile:
    """A catalog from a file's bytes, decoded with its header's charset (UTF-8 when it names none).

    Raises:
        UnreadableFile: it is not a gettext catalog, or not in its charset.
    """
    head = _CHARSET_RE.search(data[:4096].decode("latin-1"))
    charset = head.group(1) if head and head.group(1).upper() != "CHARSET" else "utf-8"
    try:
        text = data.decode(charset)
    except (LookupError, UnicodeDecodeError) as e:
        raise UnreadableFile(f"the catalog is not readable as {charset}: {e}; save it as UTF-8") from e
    try:  # polib reads a string that names an existing file as that file: such content is never a catalog
        names_a_file = os.path.isfile(text)
    except (ValueError, OSError):
        names_a_file = False
    if names_a_file or "msgid" not in text:
        raise UnreadableFile("the file is not a gettext catalog: it has no msgid")
    try:
        return polib.pofile(text, encoding=charset)
    except (OSError, ValueError) as e:  # polib raises OSError for syntax errors
        raise UnreadableFile(f"the file is not a valid gettext catalog: {e}") from e


def plural_forms(catalog: polib.POFile, target: str) -> Plurals:
    """The catalog's plural forms, its ``Language`` and ``Plural-Forms`` set from ``target`` where they are empty
    (or the template's placeholders), and its charset set to UTF-8, which it is written in.

    Raises:
        UnreadableFile: the catalog is for another language, or its Plural-Forms cannot be read.
    """
    meta = catalog.metadata
    language = meta.get("Language", "").strip()
    if not language:
        meta["Language"] = target
    elif re.split(r"[_@.-]", language)[0].lower() != target.split("-")[0].lower():
        raise UnreadableFile(f"the catalog is for language {language!r}, not {target!r}; translate it into its own")
    forms = meta.get("Plural-Forms", "").strip()
    if not forms or "INTEGER" in forms:
        forms = default_plural_forms(target)
        meta["Plural-Forms"] = forms
    content = meta.get("Content-Type", "")
    if "charset=utf-8" not in content.lower().replace(" ", ""):
        meta["Content-Type"] = "text/plain; charset=UTF-8"
    catalog.encoding = "utf-8"
    match = _NPLURALS_RE.search(forms)
    try:
        assert match is not None
        formula: Callable[[int], int] = gettext.c2py(match.group(2))
        return Plurals.of(int(match.group(1)), formula)
    except (AssertionError, ValueError, SyntaxError) as e:
        raise UnreadableFile(f"the catalog's Plural-Forms {forms!r} cannot be read: {e}") from e


def default_plural_forms(language: str) -> str:
    """A language's Plural-Forms header from babel's table (gettext's own list); ``nplurals=2; plural=(n != 1);``,
    the English form, for a language babel does not know."""
    from babel.core import UnknownLocaleError
    from babel.messages.plurals import get_plural

    try:
        return str(get_plural(language.replace("-", "_")).plural_forms)
    except (UnknownLocaleError, ValueError):
        return "nplurals=2; plural=(n != 1);"


Slot = tuple[polib.POEntry, int | None, str]  # an entry, its msgstr[index] (None: msgstr), the English it translates


def empty_slots(catalog: polib.POFile, plurals: Plurals) -> list[Slot]:
    """Every msgstr to fill: empty msgstrs of live entries (the header and obsolete entries are not entries here),
    and each plural entry's empty msgstr[0..count-1]; a plural entry's empty msgstr[n] beyond the language's count
    are removed (msgfmt refuses them)."""
    slots: list[Slot] = []
    for entry in catalog:
        if entry.obsolete:
            continue
        if not entry.msgid_plural:
            if not entry.msgstr:
                slots.append((entry, None, entry.msgid))
            continue
        for index in [i for i, s in entry.msgstr_plural.items() if i >= plurals.count and not s]:
            del entry.msgstr_plural[index]
        for index in range(plurals.count):
            if not entry.msgstr_plural.get(index):
                slots.append((entry, index, plurals.source(index, entry.msgid, entry.msgid_plural)))
    return slots


async def translate_catalog(catalog: polib.POFile, translate: Translate, target: str, fuzzy: bool = True) -> Report:
    """Fill every empty msgstr of ``catalog`` in place (:func:`empty_slots`), marking each filled entry ``fuzzy``
    unless ``fuzzy`` is False; headers, comments, flags, obsolete entries and existing translations are kept.

    A translation that loses a format directive the entry's flags make msgfmt check keeps the English source
    instead, and so does a text over a limit; both are marked fuzzy whatever ``fuzzy`` says, for a translator.

    Raises:
        UnreadableFile: as :func:`plural_forms`.
    """
    slots = empty_slots(catalog, plural_forms(catalog, target))
    translations = await translate_units([source for _, _, source in slots], translate)
    kept = over = 0
    for entry, index, source in slots:
        text = rebuild(source, translations)
        lost = not keeps_directives(source, text, entry.flags)
        refused = any(translations[core] is None for core in cores(source))
        kept, over = kept + lost, over + refused
        if index is None:
            entry.msgstr = source if lost else text
        else:
            entry.msgstr_plural[index] = source if lost else text
        if (fuzzy or lost or refused) and "fuzzy" not in entry.flags:
            entry.flags.insert(0, "fuzzy")  # first, as msgmerge writes it
    return Report(len(slots), kept, over)


async def translate_file(data: bytes, translate: Translate, target: str) -> bytes:
    """A ``.po`` file translated into ``target`` (:func:`translate_catalog`), as UTF-8.

    Raises:
        UnreadableFile: the file is not a catalog, or one of another language.
    """
    catalog = await asyncio.to_thread(parse, data)  # a large catalog takes the event loop's time to read and write
    await translate_catalog(catalog, translate, target)
    return await asyncio.to_thread(lambda: str(catalog).encode("utf-8"))
