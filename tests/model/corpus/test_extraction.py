"""Tests of model/corpus/extraction.py: .mo reading, language directories, licenses and .debs."""

from __future__ import annotations

import gettext
import io
import shutil
import subprocess
from pathlib import Path

import pytest

from model.corpus.extraction import (
    CatalogEntry,
    catalog_lang_dir,
    entry_pairs,
    lang_dir_matches,
    parse_mo,
    read_deb,
    summarize_license,
)
from tests.model.corpus.debs import needs_dpkg, write_mo

MO_ENTRIES = [
    ("Open", "開く"),
    ("menu\x04Quit", "終了"),
    ("%d file\x00%d files", "%d 個のファイル"),
    ("%d window\x00%d windows", "%d Fenster\x00%d Fenster (plural)"),
    ("Untranslated", ""),
]


def test_parse_mo_reads_plurals_and_contexts() -> None:
    data = write_mo(MO_ENTRIES)
    entries = {e.msgid: e for e in parse_mo(data)}
    assert "" not in entries  # the header
    assert entries["Quit"] == CatalogEntry("Quit", ("終了",), None, "menu")
    assert entries["%d file"].msgid_plural == "%d files"
    assert entry_pairs(entries["%d file"]) == [("%d file", "%d 個のファイル"), ("%d files", "%d 個のファイル")]
    assert entry_pairs(entries["%d window"]) == [("%d window", "%d Fenster"), ("%d windows", "%d Fenster (plural)")]
    assert entry_pairs(entries["Untranslated"]) == []
    # The singular side agrees with the standard library's reader.
    catalog = gettext.GNUTranslations(io.BytesIO(data))._catalog  # type: ignore[attr-defined]
    assert catalog["Open"] == entries["Open"].msgstrs[0]
    assert catalog[("%d file", 0)] == "%d 個のファイル"
    assert catalog["menu\x04Quit"] == "終了"


def test_parse_mo_matches_msgfmt_when_available(tmp_path: Path) -> None:
    if shutil.which("msgfmt") is None:
        pytest.skip("msgfmt is not installed")
    po = tmp_path / "x.po"
    po.write_text(
        'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\nPlural-Forms: nplurals=1; plural=0;\\n"\n\n'
        'msgctxt "menu"\nmsgid "Quit"\nmsgstr "終了"\n\n'
        'msgid "%d file"\nmsgid_plural "%d files"\nmsgstr[0] "%d 個のファイル"\n',
        encoding="utf-8",
    )
    subprocess.run(["msgfmt", "-o", str(tmp_path / "x.mo"), str(po)], check=True)
    entries = parse_mo((tmp_path / "x.mo").read_bytes())
    assert [(e.msgctxt, e.msgid, e.msgid_plural, e.msgstrs) for e in entries] == [
        (None, "%d file", "%d files", ("%d 個のファイル",)),
        ("menu", "Quit", None, ("終了",)),
    ]


def test_parse_mo_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_mo(b"not a catalog at all")


@pytest.mark.parametrize(
    ("dirname", "expected"),
    [("ja", True), ("ja_JP", True), ("ja_JP.UTF-8", True), ("jam", False), ("de_CH", False), ("de@hebrew", False)],
)
def test_lang_dir_matches(dirname: str, expected: bool) -> None:
    assert lang_dir_matches(dirname, dirname[:2] if dirname != "jam" else "ja") is expected


def test_catalog_lang_dir() -> None:
    assert catalog_lang_dir("usr/share/locale/ja/LC_MESSAGES/foo.mo") == "ja"
    assert catalog_lang_dir("usr/lib/libreoffice/program/resource/ja/LC_MESSAGES/sw.mo") == "ja"
    assert catalog_lang_dir("ja/messages.mo") == "ja"  # inside calibre's locales.zip
    assert catalog_lang_dir("usr/share/locale/ja/LC_TIME/foo.mo") is None
    assert catalog_lang_dir("usr/share/doc/foo/copyright") is None


def test_summarize_license() -> None:
    dep5 = (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
        "Files: debian/*\nLicense: GPL-3+\n\nFiles: *\nCopyright: 2020 Someone\nLicense: GPL-2+\n text\n"
    )
    assert summarize_license(dep5) == ("GPL-2+", ["GPL-2+", "GPL-3+"])
    assert summarize_license(None, link="../foo") == ("see ../foo", [])
    assert summarize_license(None) == ("none", [])
    assert summarize_license("see /usr/share/common-licenses/LGPL-2.1 for the text")[0] == "LGPL-2.1"
    assert summarize_license("under the GNU General Public License, version 2")[0] == "GPL"
    assert summarize_license("Permission is hereby granted, free of charge, to any person")[0] == "MIT"


@needs_dpkg
def test_read_deb_finds_catalogs_in_all_places(debs: Path) -> None:
    foo = read_deb(debs / "gnome-foo_1.0-1_all.deb", "ja")
    assert foo.package == "gnome-foo"
    assert sorted(foo.catalogs) == [
        "usr/share/locale/ja/LC_MESSAGES/foo.mo",
        "usr/share/locale/ja_JP/LC_MESSAGES/bar.mo",
    ]  # the LC_TIME link is skipped
    assert foo.copyright is not None and "GPL-2+" in foo.copyright
    calibre = read_deb(debs / "calibre_1.0-1_all.deb", "ja")
    assert sorted(calibre.catalogs) == [
        "usr/lib/libreoffice/program/resource/ja/LC_MESSAGES/sw.mo",
        "usr/share/calibre/localization/locales.zip!ja/messages.mo",
    ]
    assert calibre.copyright is None and calibre.copyright_link == "gnome-foo"
