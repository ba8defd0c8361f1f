"""Reading gettext catalogs (``.mo``) and copyright files straight out of downloaded ``.deb`` files."""

from __future__ import annotations

import io
import logging
import re
import struct
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from model.corpus.fetching import package_of

LOG = logging.getLogger(__name__)

# Language directory → the region whose catalogs we also accept (ja_JP, de_DE). Regional variants with their own
# spelling (de_CH writes "ss" for "ß", de_AT) are left out; unlisted languages accept <lang>_<LANG>.
DEFAULT_REGION = {"ja": "JP", "de": "DE", "en": "US", "zh": "CN", "ko": "KR", "pt": "PT", "sv": "SE", "da": "DK"}


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


def parse_mo(data: bytes) -> list[CatalogEntry]:  # long: one pass over the binary tables, header then entries
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
