"""A parallel corpus (English → another language) from the gettext catalogs in Debian packages.

Volunteers translate the user-interface strings of free software into dozens of languages; Debian ships them as
compiled gettext catalogs (``.mo``). Each catalog entry is a pair (English ``msgid``, translated ``msgstr``). This
module reads the catalogs straight out of downloaded ``.deb`` files (nothing is installed), cleans the pairs, splits
them into train/dev/test by English source, and writes three TSV files plus ``summary.json``::

    python -m model.corpus build --pair en-ja            # ~/.cache/attnserve/corpus/en-ja/{train,dev,test}.tsv
    python -m model.corpus build --pair en-de --download # fetch missing .debs with apt-get download first

Every TSV row is ``source<TAB>target<TAB>packages`` (packages: comma-joined, sorted names of the Debian packages the
pair came from). The same ``.deb`` files always give byte-identical outputs: everything is sorted and nothing depends
on time or on the iteration order of sets or dicts.

The cleaning functions (:func:`clean_text`, :func:`strip_accelerators`, :func:`keep_pair`, :func:`split_of`, ...) are
pure, so they are unit-tested on hand-written examples.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import re
import shlex
import struct
import subprocess
import sys
import tarfile
import time
import unicodedata
import zipfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

LOG = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PACKAGES = "../shared/data/gettext-packages.txt"  # relative to the repository root
DEFAULT_DEBS_DIR = "~/.cache/attnserve/debs"
DEFAULT_CORPUS_DIR = "~/.cache/attnserve/corpus"

MAX_CHARS = 200  # longer UI strings are mostly help paragraphs with markup; they dominate the padding budget
MAX_WIDTH_RATIO = 3.0  # display widths (CJK = 2) of source and target may differ at most this much ...
RATIO_SMOOTHING = 4  # ... after adding this many columns to both: "Up" → "上へ移動" (2 vs 8 columns) is a good pair
SPLIT_BUCKETS = 1000
TEST_BUCKETS = range(0, 12)  # 1.2 % of English sources each: ≥ 2,000 pairs for en-ja and en-de
DEV_BUCKETS = range(12, 24)
SPLITS = ("train", "dev", "test")

# Language directory → the region whose catalogs we also accept (ja_JP, de_DE). Regional variants with their own
# spelling (de_CH writes "ss" for "ß", de_AT) are left out; unlisted languages accept <lang>_<LANG>.
DEFAULT_REGION = {"ja": "JP", "de": "DE", "en": "US", "zh": "CN", "ko": "KR", "pt": "PT", "sv": "SE", "da": "DK"}
CJK_LANGS = frozenset({"ja", "zh", "ko"})

DROP_RULES = (  # the reasons keep_pair() gives, in the order it checks them
    "empty",
    "credits",
    "same",
    "too_long",
    "format_only",
    "code",
    "placeholder_mismatch",
    "no_target_script",
    "length_ratio",
)

# --------------------------------------------------------------------------------------------------------------------
# Reading .mo catalogs


@dataclass(frozen=True)
class CatalogEntry:
    """One entry of a compiled gettext catalog.

    Attributes:
        msgid: The English source (singular form).
        msgstrs: The translations; one per plural form for a plural entry, else exactly one.
        msgid_plural: The English plural form, or None for a non-plural entry.
        msgctxt: The disambiguating context, or None.
    """

    msgid: str
    msgstrs: tuple[str, ...]
    msgid_plural: str | None = None
    msgctxt: str | None = None


_CHARSET_RE = re.compile(r"charset=\s*([A-Za-z0-9_.:-]+)", re.IGNORECASE)


def parse_mo(data: bytes) -> list[CatalogEntry]:
    """Parse a GNU ``.mo`` file.

    A small reader of the binary format rather than :class:`gettext.GNUTranslations`, because the latter keeps only
    the singular msgid of a plural entry (its ``_catalog`` keys are ``(msgid, n)``), and the English plural
    (``msgid_plural``) is a good training source of its own. Strings are decoded with the header's charset (UTF-8
    when it names none), as GNUTranslations does. The header entry (empty msgid) is not returned.

    Args:
        data: The whole file.

    Returns:
        The entries in file order (sorted by msgid, as msgfmt writes them).

    Raises:
        ValueError: If ``data`` is not a .mo file or an offset points outside it.
    """
    if len(data) < 20:
        raise ValueError("too short for a .mo file")
    magic = struct.unpack("<I", data[:4])[0]
    if magic == 0x950412DE:
        endian = "<"
    elif magic == 0xDE120495:
        endian = ">"
    else:
        raise ValueError(f"bad .mo magic {magic:#x}")
    _revision, n, orig_offset, trans_offset = struct.unpack(endian + "4I", data[4:20])

    def string(table: int, i: int) -> bytes:
        length, offset = struct.unpack(endian + "2I", data[table + 8 * i : table + 8 * i + 8])
        if offset + length > len(data):
            raise ValueError(f"string {i} ends outside the file")
        return data[offset : offset + length]

    raw = [(string(orig_offset, i), string(trans_offset, i)) for i in range(n)]
    charset = "utf-8"
    for orig, trans in raw:
        if orig == b"":
            match = _CHARSET_RE.search(trans.decode("ascii", errors="replace"))
            if match and match.group(1).upper() not in ("CHARSET", "ASCII"):
                charset = match.group(1)
    try:
        "".encode(charset)
    except LookupError:
        LOG.warning("unknown charset %r in a .mo header; reading it as UTF-8", charset)
        charset = "utf-8"

    entries = []
    for orig, trans in raw:
        if orig == b"":
            continue
        try:
            source, target = orig.decode(charset), trans.decode(charset)
        except UnicodeDecodeError:
            continue
        context = None
        if "\x04" in source:
            context, source = source.split("\x04", 1)
        msgid, _, plural = source.partition("\x00")
        entries.append(
            CatalogEntry(
                msgid=msgid,
                msgstrs=tuple(target.split("\x00")),
                msgid_plural=plural if "\x00" in source else None,
                msgctxt=context,
            )
        )
    return entries


def entry_pairs(entry: CatalogEntry) -> list[tuple[str, str]]:
    """The raw (English, translation) pairs of one catalog entry.

    A plural entry gives two: (msgid, msgstr[0]) and (msgid_plural, msgstr[1]); a language with a single plural form
    (Japanese) has only msgstr[0], which then translates both. Untranslated entries give nothing.

    Args:
        entry: A catalog entry.

    Returns:
        Zero, one or two pairs, texts as they are in the catalog.
    """
    msgid = entry.msgid
    if msgid.startswith("_: ") and "\n" in msgid:  # KDE 3's in-msgid context: "_: context\ntext"
        msgid = msgid.split("\n", 1)[1]
    pairs = [(msgid, entry.msgstrs[0])]
    if entry.msgid_plural is not None:
        pairs.append((entry.msgid_plural, entry.msgstrs[min(1, len(entry.msgstrs) - 1)]))
    return [(s, t) for s, t in pairs if s and t]


_LANG_DIR_RE = re.compile(r"^(?P<lang>[a-z]{2,3})(?:_(?P<region>[A-Z]{2}))?(?:\.[A-Za-z0-9_-]+)?$")


def lang_dir_matches(dirname: str, lang: str) -> bool:
    """Whether a locale directory name holds catalogs for ``lang``.

    Args:
        dirname: The directory name: ``ja``, ``ja_JP``, ``de_DE.UTF-8``, ``de_CH``, ``sr@latin``, ...
        lang: A two- or three-letter language code.

    Returns:
        True for ``lang`` itself and ``lang`` with its default region (:data:`DEFAULT_REGION`), with or without an
        encoding suffix; False for other regions (de_CH) and for modifiers (de@hebrew).
    """
    match = _LANG_DIR_RE.match(dirname)
    if not match or match.group("lang") != lang:
        return False
    region = match.group("region")
    return region is None or region == DEFAULT_REGION.get(lang, lang.upper())


def catalog_lang_dir(member: str) -> str | None:
    """The locale directory name of a ``.mo`` path, or None if the path is not a catalog.

    ``usr/share/locale/ja/LC_MESSAGES/x.mo`` (and any ``<dir>/<lang>/LC_MESSAGES/x.mo``, e.g. LibreOffice's
    ``program/resource/ja/LC_MESSAGES``) gives ``ja``; inside calibre's locales.zip, ``ja/messages.mo`` gives ``ja``.
    """
    parts = PurePosixPath(member).parts
    if not parts or not parts[-1].endswith(".mo"):
        return None
    if len(parts) >= 3 and parts[-2] == "LC_MESSAGES":
        return parts[-3]
    if len(parts) == 2:  # top level of a zip of catalogs: <lang>/<domain>.mo
        return parts[0]
    return None


@dataclass
class DebCatalogs:
    """What one .deb contributes: its package name, raw pairs per catalog, and its copyright file."""

    package: str
    deb: str
    catalogs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # member path → raw pairs
    copyright: str | None = None  # the copyright file's text
    copyright_link: str | None = None  # where the file or the doc directory links to (another package's)


def package_of(deb_name: str) -> str:
    """The package name of a .deb file name as ``apt-get download`` writes it (``name_version_arch.deb``)."""
    return deb_name.split("_", 1)[0]


def _read_zip_catalogs(data: bytes, zip_path: str, lang: str, out: dict[str, list[tuple[str, str]]]) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        LOG.warning("%s: not a zip file", zip_path)
        return
    for name in sorted(archive.namelist()):
        lang_dir = catalog_lang_dir(name)
        if lang_dir is not None and lang_dir_matches(lang_dir, lang):
            _add_catalog(archive.read(name), f"{zip_path}!{name}", out)


def _add_catalog(data: bytes, path: str, out: dict[str, list[tuple[str, str]]]) -> None:
    try:
        entries = parse_mo(data)
    except (ValueError, struct.error) as error:
        LOG.warning("%s: unreadable catalog (%s)", path, error)
        return
    out[path] = [pair for entry in entries for pair in entry_pairs(entry)]


def read_deb(deb: Path, lang: str) -> DebCatalogs:
    """Read the catalogs for ``lang`` and the copyright file out of one .deb, in one streaming pass.

    The data archive is piped out of ``dpkg-deb --fsys-tarfile`` into :mod:`tarfile` in stream mode, so nothing is
    written to disk. Catalogs are regular files ``.../<lang dir>/LC_MESSAGES/*.mo`` (symbolic links are skipped: they
    point at a catalog read anyway), plus the ``.mo`` files inside zip archives whose name mentions "locale"
    (calibre's ``localization/locales.zip``).

    Args:
        deb: The .deb file.
        lang: The target language code (``ja``, ``de``).

    Returns:
        The package's catalogs and copyright.

    Raises:
        RuntimeError: If dpkg-deb fails.
    """
    package = package_of(deb.name)
    result = DebCatalogs(package=package, deb=deb.name)
    doc_dir = f"usr/share/doc/{package}"
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as archive:
            for member in archive:
                name = member.name.removeprefix("./")
                if name == doc_dir and member.issym():
                    result.copyright_link = member.linkname
                elif name == f"{doc_dir}/copyright":
                    if member.issym() or member.islnk():
                        result.copyright_link = member.linkname
                    elif member.isfile():
                        data = archive.extractfile(member).read()  # type: ignore[union-attr]
                        result.copyright = data.decode("utf-8", errors="replace")
                elif not member.isfile():
                    continue
                elif name.endswith(".mo"):
                    lang_dir = catalog_lang_dir(name)
                    if lang_dir is not None and lang_dir_matches(lang_dir, lang):
                        _add_catalog(archive.extractfile(member).read(), name, result.catalogs)  # type: ignore[union-attr]
                elif name.endswith(".zip") and "locale" in PurePosixPath(name).name:
                    _read_zip_catalogs(archive.extractfile(member).read(), name, lang, result.catalogs)  # type: ignore[union-attr]
        proc.stdout.read()  # drain what tarfile did not need, so dpkg-deb exits cleanly
    if proc.returncode != 0:
        raise RuntimeError(f"dpkg-deb --fsys-tarfile {deb} exited with {proc.returncode}")
    return result


# --------------------------------------------------------------------------------------------------------------------
# Licences

_COMMON_LICENSE_RE = re.compile(r"/usr/share/common-licenses/([A-Za-z0-9.+-]+[A-Za-z0-9+])")
_LICENSE_KEYWORDS = (  # (short name, pattern) for copyright files that are not machine-readable (DEP-5)
    ("LGPL", r"GNU (?:Lesser|Library) General Public License|\bLGPL"),
    ("GPL", r"GNU General Public License|(?<!L)\bGPL"),
    ("MPL", r"Mozilla Public License|\bMPL\b"),
    ("Apache", r"Apache License"),
    ("MIT", r"Permission is hereby granted, free of charge|\bMIT\b|\bExpat\b"),
    ("BSD", r"Redistribution and use in source and binary forms|\bBSD\b"),
)


def summarize_license(copyright_text: str | None, link: str | None = None) -> tuple[str, list[str]]:
    """A short licence name for a Debian copyright file.

    Machine-readable files (DEP-5) give the ``License:`` of the ``Files: *`` paragraph as the main licence; other
    files give the ``/usr/share/common-licenses/`` names they cite, else keywords (GPL, LGPL, MPL, BSD, MIT, Apache).

    Args:
        copyright_text: The file's text, or None when the package has none.
        link: Where the file (or the package's doc directory) links to, when it is a symbolic link.

    Returns:
        The main licence ("unknown" when nothing is recognized, "none" without a file, "see <target>" for a link)
        and the sorted list of every licence name found.
    """
    if link is not None:
        return f"see {link}", []
    if copyright_text is None:
        return "none", []
    if re.search(r"^Format:", copyright_text, re.MULTILINE) and re.search(r"^License:", copyright_text, re.MULTILINE):
        main = None
        found = set()
        for paragraph in re.split(r"\n\s*\n", copyright_text):
            license_match = re.search(r"^License:[ \t]*(\S[^\n]*)", paragraph, re.MULTILINE)
            if not license_match:
                continue
            name = license_match.group(1).strip()
            found.add(name)
            files = re.search(r"^Files:[ \t]*([^\n]*(?:\n[ \t]+[^\n]*)*)", paragraph, re.MULTILINE)
            if main is None and files and "*" in files.group(1).split():
                main = name
        names = sorted(found)
        return (main or names[0]), names
    names = sorted(set(_COMMON_LICENSE_RE.findall(copyright_text)))
    if not names:
        names = [short for short, pattern in _LICENSE_KEYWORDS if re.search(pattern, copyright_text)]
    return (" / ".join(names) if names else "unknown"), names


# --------------------------------------------------------------------------------------------------------------------
# Cleaning

_WHITESPACE_RE = re.compile(r"\s+")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")
# "保存(_S)", "ファイル(&F)", "開く(~O)..." (LibreOffice marks with "~"), also with full-width parentheses.
_MARKED_SUFFIX_RE = re.compile(r"\s*[(（][_&~][A-Za-z0-9][)）]")
# "ファイル(F)": an unmarked accelerator letter in parentheses, at the end or before "...", "…" or ":".
_BARE_SUFFIX_RE = re.compile(r"\s*[(（][A-Z0-9][)）](?=\s*(?:\.\.\.|…|:|：)?\s*$)")
_UNDERSCORE_RE = re.compile(r"(?<![\w_])_(?=[^\W_])")  # "_File", "Save _As"; not "foo_bar", not "__"
_MID_UNDERSCORE_RE = re.compile(r"(?<=[^\W_])_(?=[^\W_])")  # "Or_ientation", but also "max_connections"
_TOKEN_RE = re.compile(r"[\w.-]+")
# "&File", "Fi&le"; not "&&", not entities (&amp; &#38; &#x26;); "AT&T" and "Q&A" are checked in _ampersand().
_AMPERSAND_RE = re.compile(r"(?<!&)&(?=[^\W_])(?!(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);)")
# LibreOffice's "~Save", "Pr~eview"; not "~/path", "~5", "0~150", "A~Z".
_TILDE_RE = re.compile(r"(?<![\w~/])~(?=[A-Za-z])|(?<=[A-Za-z])~(?=[a-z])")


def _ampersand(match: re.Match[str]) -> str:
    text, start = match.string, match.start()
    between_capitals = start > 0 and text[start - 1].isupper() and text[start + 1].isupper()
    return "&" if between_capitals else ""  # AT&T, Q&A, R&D stay


def strip_accelerators(text: str, lang: str, other: str | None = None) -> str:
    """Remove keyboard-accelerator markers from a UI string.

    Handles GTK's ``_File``, Qt/KDE's ``&File`` and ``Fi&le`` (``&&``, HTML entities like ``&amp;`` and ``AT&T`` are
    left alone), LibreOffice's ``~File`` and ``Pr~eview``, and the parenthesized suffixes of CJK translations:
    ``ファイル(_F)``, ``ファイル(&F)``, ``（_F）``; for CJK languages also the unmarked ``ファイル(F)`` at the end.

    An underscore inside a word (GTK's ``Or_ientation``) looks like an identifier (``max_connections``), so it is
    only removed when the other side of the pair is given and does not contain the word: translators copy
    identifiers, never accelerators. It must also be the text's only underscore, and not follow capitals
    (``MZ_leaves``).

    Args:
        text: The UI string.
        lang: Its language code; the unmarked suffix form is only removed for ``ja``, ``zh`` and ``ko``.
        other: The other side of the pair (raw), or None to leave underscores inside words alone.

    Returns:
        The text without markers (whitespace is not collapsed here).
    """
    text = _MARKED_SUFFIX_RE.sub("", text)
    if lang in CJK_LANGS:
        text = _BARE_SUFFIX_RE.sub("", text)
    text = _UNDERSCORE_RE.sub("", text)
    if other is not None and text.count("_") == 1 and (match := _MID_UNDERSCORE_RE.search(text)):
        token = next(t for t in _TOKEN_RE.finditer(text) if t.start() <= match.start() < t.end()).group()
        head = token.split("_")[0]
        if token not in other and not (len(head) > 1 and head.isupper()):
            text = text[: match.start()] + text[match.end() :]
    text = _AMPERSAND_RE.sub(_ampersand, text)
    return _TILDE_RE.sub("", text)


_FREECIV_QUALIFIER_RE = re.compile(r"^\?[^:?]{1,40}:(?=\S)")  # freeciv's Q_("?plural:Frisians")
_LYX_CONTEXT_RE = re.compile(r"\[\[[a-z][a-z ,'-]*\]\]")  # LyX's "mu[[unit of measure]]"
_LYX_SHORTCUT_RE = re.compile(r"\|#?[^\s|]$")  # LyX's menu shortcut "Simple Frame|F"
_KDE_SCRIPT_SEPARATOR = "|/|"  # KDE Transcript: "translation|/|$[script]"
_PIPE_CONTEXT_RE = re.compile(r"^[A-Za-z]\w*\|(?=[^|\s][^|]*$)")  # Qt/fontforge "Layer|Background", "Panose|Any"


def clean_text(text: str, lang: str, other: str | None = None) -> str:
    """Normalize one side of a pair: NFC, accelerators removed, control characters dropped, whitespace collapsed.

    Args:
        text: The raw catalog string.
        lang: Its language code (see :func:`strip_accelerators`).
        other: The other side of the pair (raw), to tell accelerators from identifiers (see
            :func:`strip_accelerators`).

    Returns:
        A single-line string without tabs, newlines or leading/trailing spaces.
    """
    text = unicodedata.normalize("NFC", text)
    text = _WHITESPACE_RE.sub(" ", text)  # before stripping: "\n_Open" must still see a word start
    text = strip_accelerators(text, lang, other)
    text = _CONTROL_RE.sub("", text)
    return _WHITESPACE_RE.sub(" ", text).strip()


def clean_pair(source: str, target: str, target_lang: str) -> tuple[str, str]:
    """Clean a raw (English, translation) pair from a catalog.

    Besides :func:`clean_text` on each side, removes what some projects put in their strings for their own tools:
    freeciv's ``?qualifier:`` prefix, LyX's ``[[context]]`` and ``|S`` shortcut suffix, a ``Context|`` prefix
    (``Layer|Background``, when the translation has no ``|``), and the KDE Transcript script after ``|/|`` in a
    translation.

    Args:
        source: The raw English msgid.
        target: The raw translation.
        target_lang: The translation's language code.

    Returns:
        The cleaned (source, target).
    """
    target = target.split(_KDE_SCRIPT_SEPARATOR, 1)[0]
    source, target = (_LYX_SHORTCUT_RE.sub("", _LYX_CONTEXT_RE.sub("", side)) for side in (source, target))
    source = _FREECIV_QUALIFIER_RE.sub("", source)
    if "|" not in target:
        source = _PIPE_CONTEXT_RE.sub("", source)
    return clean_text(source, "en", other=target), clean_text(target, target_lang, other=source)


def display_width(text: str) -> int:
    """The width of a text in terminal columns: 2 for wide and full-width (CJK) characters, else 1.

    A length ratio of raw character counts treats "ファイルを開く" (7 characters) as shorter than "Open file" (9),
    while it carries as much information; widths make the ratio fair across scripts.
    """
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


PLACEHOLDER_RE = re.compile(
    r"%%"  # a literal percent sign (filtered out by placeholders())
    r"|%\([A-Za-z_]\w*\)[-+#0 ]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"  # Python: %(name)s
    r"|%(?:\d+\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64)?[diouxXeEfFgGaAcspn]"  # C: %s %5.2f
    r"|%\d+"  # Qt / KDE: %1
    r"|\{[A-Za-z0-9_]*(?:[!:][^{}]*)?\}"  # Python / C#: {0} {name} {:d}
)


def placeholders(text: str) -> list[str]:
    """The format placeholders in a text, sorted, with positional C forms normalized (``%2$s`` → ``%s``).

    Translators reorder arguments with ``%2$s``; the multiset of placeholders is what must match between source and
    target.
    """
    found = [m.group() for m in PLACEHOLDER_RE.finditer(text) if m.group() != "%%"]
    return sorted(re.sub(r"^%\d+\$", "%", p) for p in found)


# KDE's and GNOME's conventions for the translators' names and addresses: never a translation.
_CREDITS_RE = re.compile(
    r"^(?:translator[-_]credits|translatorcredits|your names|your emails|(?:name|email)s? of translators"
    r"|roles[-_ ]of[-_ ]translators|credit[-_ ]for[-_ ]translators|(?-i:TRANSLATORS))$",
    re.IGNORECASE,
)
# Labels that are either a real UI string ("Translators" → "翻訳者") or the credits themselves (a list of names).
_MAYBE_CREDITS_RE = re.compile(
    r"^(?:translators?|translator credits|translated by|translation credits|your names?|your e-?mails?)[:.]?$",
    re.IGNORECASE,
)
_NAMES_RE = re.compile(r"[@,<]|\S+ \S+ \S+")  # an address, a list, or three or more names
# Markup that leaves no words behind (kept in the pair, ignored by the format_only check); "<Any>" is a word.
_TAG_RE = re.compile(
    r"</?(?:a|b|big|body|br|center|code|div|em|font|h[1-6]|head|hr|html|i|img|li|nobr|ol|p|pre|qt|s|small|span"
    r"|strong|sub|sup|table|td|th|tr|tt|u|ul)\b[^<>]*>",
    re.IGNORECASE,
)
_ENTITY_RE = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")
_SYNONYM_LIST_RE = re.compile(r"[^\s;];[^\s;]")  # KDE unit names: "kilogram;kilograms;kg"
_URL_OR_PATH_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|www\.|mailto:|~?/|\.\.?/|[A-Za-z]:\\)|^[^@\s]+@[^@\s]+\.\w+$")
_IDENTIFIER_RES = (
    re.compile(r"[^\W_]_[^\W_]"),  # snake_case, CONSTANT_NAME
    re.compile(r"[a-z][A-Z]"),  # camelCase, CamelCase
    re.compile(r"[A-Za-z]\.[A-Za-z]"),  # org.gnome.Foo, file.txt
    re.compile(r"^-{1,2}[A-Za-z]"),  # --option
    re.compile(r"\w(?:=|\[|\((?!s\)))"),  # key=value, call(), array[0]; not "file(s)"
    re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*-(?:symbolic|ltr|rtl)$|^(?:gtk|gnome|stock|gimp|kde)-[a-z0-9-]+$"),
)
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]")


def is_code(text: str) -> bool:
    """Whether a source string is a code identifier, a path or a URL rather than something a user reads.

    Single tokens (no space): ``foo_bar``, ``gtk-ok``, ``fooBar``, ``org.gnome.Foo``, ``--help``, ``key=value``,
    ``/usr/bin``, ``https://example.org``; hyphenated words (``read-only``, ``e-mail``), ``TCP/IP`` and
    ``(default)`` are words. Any text: semicolon-separated synonym lists (``kilogram;kilograms;kg``), whose
    translations append to the list instead of translating it.
    """
    if _SYNONYM_LIST_RE.search(_ENTITY_RE.sub(" ", text)):
        return True
    if " " in text:
        return False
    if _URL_OR_PATH_RE.search(text):
        return True
    return any(pattern.search(text) for pattern in _IDENTIFIER_RES)


def has_letters(text: str) -> bool:
    """Whether a text has letters outside its placeholders and markup tags (``"%s: %s"`` and ``"<b>%s</b>"`` do not)."""
    return any(ch.isalpha() for ch in _TAG_RE.sub("", PLACEHOLDER_RE.sub("", text)))


def width_ratio_too_large(source: str, target: str) -> bool:
    """Whether the display widths of the two sides differ more than :data:`MAX_WIDTH_RATIO` times.

    Widths are smoothed by :data:`RATIO_SMOOTHING` columns, so short labels, whose ratio is noise ("Vertical Line" →
    "縦線", 13 vs 4 columns), pass, while "Decimal places. The number of fixed decimal places that are to be
    displayed." → "小数点以下の桁数。" (77 vs 18) does not.
    """
    source_width, target_width = display_width(source), display_width(target)
    longer, shorter = max(source_width, target_width), min(source_width, target_width)
    return longer + RATIO_SMOOTHING > MAX_WIDTH_RATIO * (shorter + RATIO_SMOOTHING)


def keep_pair(source: str, target: str, target_lang: str | None = None) -> str | None:
    """Decide whether a cleaned pair belongs in the corpus.

    The rules, checked in the order of :data:`DROP_RULES`:

    - ``empty``: a side is empty.
    - ``credits``: the translator-credits entries ("translator-credits", "Your names", ...), and labels such as
      "Translators" whose translation is a list of names rather than a word.
    - ``same``: the target equals the source (untranslated).
    - ``too_long``: a side has more than :data:`MAX_CHARS` characters.
    - ``format_only``: the source has no letters once placeholders and markup are removed ("%s: %s").
    - ``code``: :func:`is_code`.
    - ``placeholder_mismatch``: source and target placeholders differ (:func:`placeholders`): the model must learn
      to copy them exactly, never to invent or lose one ("1 day ago" → "%d日前", strftime formats).
    - ``no_target_script``: for a CJK target language, the target has no CJK character (left in English).
    - ``length_ratio``: :func:`width_ratio_too_large`.

    Args:
        source: The cleaned English text (see :func:`clean_pair`).
        target: The cleaned translation.
        target_lang: The translation's language code; None skips the ``no_target_script`` rule.

    Returns:
        None to keep the pair, else the name of the rule that drops it.
    """
    if not source or not target:
        return "empty"
    if _CREDITS_RE.match(source) or (_MAYBE_CREDITS_RE.match(source) and _NAMES_RE.search(target)):
        return "credits"
    if source == target:
        return "same"
    if len(source) > MAX_CHARS or len(target) > MAX_CHARS:
        return "too_long"
    if not has_letters(source):
        return "format_only"
    if is_code(source):
        return "code"
    if placeholders(source) != placeholders(target):
        return "placeholder_mismatch"
    if target_lang in CJK_LANGS and not _CJK_RE.search(target):
        return "no_target_script"
    if width_ratio_too_large(source, target):
        return "length_ratio"
    return None


# --------------------------------------------------------------------------------------------------------------------
# Splitting

_SPLIT_TRAILING_RE = re.compile(r"[\s.:…!?;,]+$")


def split_key(source: str) -> str:
    """The normalized English text that decides a pair's split.

    Case-folded, whitespace collapsed, and trailing punctuation ("...", "…", ":") removed, so that "Open File",
    "open file" and "Open File..." land in the same split and the test set does not reward memorizing near-duplicates.
    """
    return _SPLIT_TRAILING_RE.sub("", _WHITESPACE_RE.sub(" ", source.casefold()).strip())


def split_hash(source: str) -> int:
    """A stable 64-bit hash of :func:`split_key` (the first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(split_key(source).encode("utf-8")).digest()[:8], "big")


def split_of(source: str) -> str:
    """The split of an English source: ``"test"``, ``"dev"`` or ``"train"``.

    ``split_hash(source) mod 1000`` picks a bucket; :data:`TEST_BUCKETS` and :data:`DEV_BUCKETS` (12 each) go to test
    and dev. It depends on the English text only, so every translation of one source lands in the same split.
    """
    bucket = split_hash(source) % SPLIT_BUCKETS
    if bucket in TEST_BUCKETS:
        return "test"
    if bucket in DEV_BUCKETS:
        return "dev"
    return "train"


# --------------------------------------------------------------------------------------------------------------------
# Building


def parse_pair(pair: str) -> tuple[str, str]:
    """Split ``"en-ja"`` into ``("en", "ja")``.

    Raises:
        ValueError: If the pair is malformed or its source is not English (the catalogs' msgids are English).
    """
    match = re.fullmatch(r"([a-z]{2,3})-([a-z]{2,3})", pair)
    if not match:
        raise ValueError(f"pair {pair!r} must look like 'en-ja'")
    if match.group(1) != "en":
        raise ValueError(f"pair {pair!r}: gettext catalogs only give English sources; use 'en-<lang>'")
    return match.group(1), match.group(2)


def find_debs(debs_dir: Path) -> list[Path]:
    """The .deb files in a directory, one per package (the last file name in sorted order when there are several)."""
    by_package: dict[str, Path] = {}
    for deb in sorted(debs_dir.glob("*.deb")):
        package = package_of(deb.name)
        if package in by_package:
            LOG.warning("several .debs for %s; using %s, not %s", package, deb.name, by_package[package].name)
        by_package[package] = deb
    return [by_package[package] for package in sorted(by_package)]


def read_package_list(path: Path) -> list[str]:
    """Package names from a file with one per line (blank lines and ``#`` comments are ignored)."""
    names = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return sorted({name for name in names if name})


def download_debs(packages: Iterable[str], debs_dir: Path) -> list[str]:
    """Run ``apt-get download`` in ``debs_dir`` for the packages that have no .deb there yet.

    Args:
        packages: Package names.
        debs_dir: The cache directory; created if missing.

    Returns:
        The packages that are still missing afterwards (apt could not find them).
    """
    debs_dir.mkdir(parents=True, exist_ok=True)
    have = {package_of(deb.name) for deb in debs_dir.glob("*.deb")}
    missing = sorted(set(packages) - have)
    if missing:
        LOG.info("downloading %d packages into %s", len(missing), debs_dir)
        if subprocess.run(["apt-get", "download", *missing], cwd=debs_dir).returncode != 0:
            for package in missing:  # one unknown name fails the whole command: retry one by one
                if not list(debs_dir.glob(f"{package}_*.deb")):
                    subprocess.run(["apt-get", "download", package], cwd=debs_dir)
    have = {package_of(deb.name) for deb in debs_dir.glob("*.deb")}
    still_missing = sorted(set(packages) - have)
    if still_missing:
        LOG.warning("could not download: %s", ", ".join(still_missing))
    return still_missing


def _write_tsv(path: Path, rows: Iterable[tuple[str, ...]]) -> None:
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write("\t".join(row) + "\n")


def build(
    pair: str,
    debs_dir: Path,
    out_dir: Path,
    *,
    command: str | None = None,
    on_deb: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build the corpus for one language pair from the .debs in ``debs_dir``.

    Writes ``train.tsv``, ``dev.tsv``, ``test.tsv`` (``source<TAB>target<TAB>packages``, sorted by split hash then
    text), ``dropped.tsv`` (``rule<TAB>source<TAB>target<TAB>packages``: every distinct dropped pair, for audits) and
    ``summary.json``. The same .debs give byte-identical files.

    Args:
        pair: ``"en-ja"``, ``"en-de"``, ...
        debs_dir: Directory of downloaded .deb files.
        out_dir: Output directory; created if missing, files in it are overwritten.
        command: The command line to record in the summary.
        on_deb: Called with each .deb's file name after it is read (for a progress bar).

    Returns:
        The summary (also written to ``summary.json``).

    Raises:
        FileNotFoundError: If ``debs_dir`` has no .deb files.
    """
    _, target_lang = parse_pair(pair)
    debs = find_debs(debs_dir)
    if not debs:
        raise FileNotFoundError(f"no .deb files in {debs_dir}; run with --download")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    kept: dict[tuple[str, str], set[str]] = defaultdict(set)
    dropped: dict[tuple[str, str], tuple[str, set[str]]] = {}
    dropped_counts: Counter[str] = Counter()  # per catalog entry (occurrence), before deduplication
    raw_pairs = 0
    catalogs = 0
    licenses: dict[str, tuple[str, list[str]]] = {}
    packages_with_catalogs = set()
    for deb in debs:
        result = read_deb(deb, target_lang)
        licenses[result.package] = summarize_license(result.copyright, result.copyright_link)
        for path in sorted(result.catalogs):
            catalogs += 1
            packages_with_catalogs.add(result.package)
            for raw_source, raw_target in result.catalogs[path]:
                raw_pairs += 1
                source, target = clean_pair(raw_source, raw_target, target_lang)
                reason = keep_pair(source, target, target_lang)
                if reason is None:
                    kept[source, target].add(result.package)
                else:
                    dropped_counts[reason] += 1
                    dropped.setdefault((source, target), (reason, set()))[1].add(result.package)
        if on_deb is not None:
            on_deb(deb.name)

    rows: dict[str, list[tuple[int, str, str, str]]] = {split: [] for split in SPLITS}
    package_pairs: Counter[str] = Counter()
    for (source, target), packages in kept.items():
        rows[split_of(source)].append((split_hash(source), source, target, ",".join(sorted(packages))))
        package_pairs.update(packages)
    for split in SPLITS:
        rows[split].sort()
        _write_tsv(out_dir / f"{split}.tsv", (row[1:] for row in rows[split]))
    _write_tsv(
        out_dir / "dropped.tsv",
        sorted((reason, s, t, ",".join(sorted(p))) for (s, t), (reason, p) in dropped.items()),
    )

    dropped_unique = Counter(reason for reason, _ in dropped.values())
    summary: dict[str, Any] = {
        "pair": pair,
        "command": command or f"model.corpus.build({pair!r}, {str(debs_dir)!r}, {str(out_dir)!r})",
        "counts": {split: len(rows[split]) for split in SPLITS},
        "sources": {split: len({row[1] for row in rows[split]}) for split in SPLITS},
        "total_pairs": len(kept),
        "raw_pairs": raw_pairs,
        "catalogs": catalogs,
        "dropped": {rule: dropped_counts[rule] for rule in DROP_RULES},
        "dropped_unique": {rule: dropped_unique[rule] for rule in DROP_RULES},
        "duplicates_merged": raw_pairs - sum(dropped_counts.values()) - len(kept),
        "split": {
            "hash": "sha256(split_key(source))[:8] mod 1000",
            "test_buckets": [TEST_BUCKETS.start, TEST_BUCKETS.stop],
            "dev_buckets": [DEV_BUCKETS.start, DEV_BUCKETS.stop],
        },
        "packages_read": len(debs),
        "packages_with_catalogs": len(packages_with_catalogs),
        "packages_contributing": len(package_pairs),
        "packages": {
            package: {
                "pairs": package_pairs[package],
                "license": licenses[package][0],
                "licenses": licenses[package][1],
            }
            for package in sorted(licenses)
            if package in package_pairs
        },
        "debs": [deb.name for deb in debs],
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    LOG.info(
        "%s: %d pairs (train %d, dev %d, test %d) from %d packages in %.0f s",
        pair,
        len(kept),
        *(len(rows[split]) for split in SPLITS),
        len(package_pairs),
        time.monotonic() - started,
    )
    return summary


def read_tsv(path: Path) -> Iterator[tuple[str, str, str]]:
    """Rows ``(source, target, packages)`` of a corpus TSV file written by :func:`build`."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            source, target, packages = line.rstrip("\n").split("\t")
            yield source, target, packages


# --------------------------------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    """``python -m model.corpus build --pair en-ja [--download] [--no-spm]``."""
    parser = argparse.ArgumentParser(prog="python -m model.corpus", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build train/dev/test TSVs (and a SentencePiece model)")
    build_parser.add_argument("--pair", required=True, help="language pair, e.g. en-ja or en-de")
    build_parser.add_argument("--debs-dir", type=Path, default=Path(DEFAULT_DEBS_DIR), help="cache of .deb files")
    build_parser.add_argument("--out", type=Path, help=f"output directory (default {DEFAULT_CORPUS_DIR}/<pair>)")
    build_parser.add_argument("--download", action="store_true", help="apt-get download the missing .debs first")
    build_parser.add_argument(
        "--packages", type=Path, default=Path(DEFAULT_PACKAGES), help="package list (relative to the repository root)"
    )
    build_parser.add_argument("--no-spm", action="store_true", help="do not train the SentencePiece model")
    build_parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary size")
    build_parser.add_argument("--spm-threads", type=int, default=2, help="SentencePiece training threads")
    build_parser.add_argument(
        "--character-coverage",
        type=float,
        help="SentencePiece character coverage (default 0.9995 for a CJK target language, else 1.0)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    debs_dir = args.debs_dir.expanduser()
    out_dir = (args.out or Path(DEFAULT_CORPUS_DIR) / args.pair).expanduser()
    if args.download:
        packages_file = args.packages if args.packages.is_absolute() else REPO_ROOT / args.packages
        download_debs(read_package_list(packages_file), debs_dir)

    from tqdm import tqdm

    started = time.monotonic()
    command = shlex.join(["python", "-m", "model.corpus", *(sys.argv[1:] if argv is None else argv)])
    with tqdm(total=len(find_debs(debs_dir)), unit="deb", desc=f"reading {args.pair}") as bar:
        summary = build(args.pair, debs_dir, out_dir, command=command, on_deb=lambda _: bar.update())
    print(f"corpus: {json.dumps(summary['counts'])}, dropped {json.dumps(summary['dropped'])}")
    print(f"corpus built in {time.monotonic() - started:.0f} s: {out_dir}")

    if not args.no_spm:
        from model.tokenizer import train_corpus_tokenizer

        spm_started = time.monotonic()
        coverage = args.character_coverage or (0.9995 if parse_pair(args.pair)[1] in CJK_LANGS else 1.0)
        stats = train_corpus_tokenizer(
            out_dir, vocab_size=args.vocab_size, num_threads=args.spm_threads, character_coverage=coverage
        )
        summary["spm"] = stats
        (out_dir / "summary.json").write_text(
            json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )
        print(f"spm trained in {time.monotonic() - spm_started:.0f} s: {json.dumps(stats)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
