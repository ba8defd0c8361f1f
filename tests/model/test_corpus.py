"""Tests of model/corpus.py: cleaning rules, the split, .mo reading, and a build from tiny .debs."""

from __future__ import annotations

import gettext
import io
import json
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

from model.corpus import (
    MAX_WIDTH_RATIO,
    RATIO_SMOOTHING,
    CatalogEntry,
    build,
    catalog_lang_dir,
    clean_pair,
    clean_text,
    display_width,
    entry_pairs,
    is_code,
    keep_pair,
    lang_dir_matches,
    parse_mo,
    placeholders,
    read_deb,
    read_tsv,
    split_key,
    split_of,
    strip_accelerators,
    summarize_license,
)


def write_mo(entries: list[tuple[str, str]], charset: str = "UTF-8") -> bytes:
    """The GNU .mo binary format for (key, value) strings, as msgfmt writes it (no hash table).

    Keys are ``msgid``, ``ctx\\x04msgid`` or ``msgid\\x00msgid_plural``; values join plural forms with ``\\x00``.
    """
    header = f"Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
    items = sorted([("", header), *entries], key=lambda kv: kv[0].encode(charset))
    keys = [k.encode(charset) for k, _ in items]
    values = [v.encode(charset) for _, v in items]
    n = len(items)
    orig_table, trans_table = 28, 28 + 8 * n
    offset = 28 + 16 * n
    key_offsets, value_offsets, blob = [], [], b""
    for data, offsets in [(k, key_offsets) for k in keys] + [(v, value_offsets) for v in values]:
        offsets.append((len(data), offset + len(blob)))
        blob += data + b"\x00"
    out = struct.pack("<7I", 0x950412DE, 0, n, orig_table, trans_table, 0, offset)
    for length, start in key_offsets + value_offsets:
        out += struct.pack("<2I", length, start)
    return out + blob


# --- cleaning -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        ("_File", "en", "File"),
        ("Save _As...", "en", "Save As..."),
        ("&Open", "en", "Open"),
        ("E&xit", "en", "Exit"),
        ("Tom && Jerry", "en", "Tom && Jerry"),
        ("Fish &amp; Chips &#38; &lt;b&gt;", "en", "Fish &amp; Chips &#38; &lt;b&gt;"),
        ("AT&T and Q&A", "en", "AT&T and Q&A"),
        ("Tools & Settings", "en", "Tools & Settings"),
        ("~Save", "en", "Save"),
        ("Pr~eview", "en", "Preview"),
        ("~/.config", "en", "~/.config"),
        ("snake_case", "en", "snake_case"),
        ("__init__", "en", "__init__"),
        ("ファイル(_F)", "ja", "ファイル"),
        ("開く(&O)...", "ja", "開く..."),
        ("名前を付けて保存(_A)…", "ja", "名前を付けて保存…"),
        ("保存（_S）", "ja", "保存"),
        ("保存(~S)", "ja", "保存"),
        ("ファイル(F)", "ja", "ファイル"),
        ("サイズ(MB)", "ja", "サイズ(MB)"),
        ("0~150", "ja", "0~150"),
        ("Ö_ffnen", "de", "Ö_ffnen"),  # inside a word only with the other side given (see below)
    ],
)
def test_strip_accelerators(text: str, lang: str, expected: str) -> None:
    assert strip_accelerators(text, lang) == expected


def test_underscore_inside_a_word_is_an_accelerator_only_when_the_translation_lacks_the_word() -> None:
    assert clean_pair("Or_ientation", "向き(_I)", "ja") == ("Orientation", "向き")
    assert clean_pair("Drive S_ettings…", "ドライブの設定…", "ja") == ("Drive Settings…", "ドライブの設定…")
    assert clean_pair("could not set max_connections", "max_connections を設定できません", "ja") == (
        "could not set max_connections",
        "max_connections を設定できません",
    )
    assert clean_pair("Ö_ffnen", "Ö_ffnen", "de")[0] == "Ö_ffnen"
    assert clean_pair("_Open", "Ö_ffnen", "de") == ("Open", "Öffnen")


def test_clean_pair_removes_project_conventions() -> None:
    assert clean_pair("?plural:Frisians", "フリース人", "ja") == ("Frisians", "フリース人")
    assert clean_pair("mu[[unit of measure]]", "ミュー", "ja") == ("mu", "ミュー")
    assert clean_pair("Simple Frame|F", "簡素な枠(F)|F", "ja") == ("Simple Frame", "簡素な枠")
    assert clean_pair("Layer|Background", "背景", "ja") == ("Background", "背景")
    assert clean_pair("Send", "送信|/|$[setProps label '送信']", "ja") == ("Send", "送信")


def test_clean_text_collapses_whitespace_and_normalizes() -> None:
    assert clean_text("  Open\n\tthe   file\r\n", "en") == "Open the file"
    assert clean_text("Cafe\u0301", "en") == "Café"  # NFC
    assert "\t" not in clean_text("a\tb", "ja")


def test_placeholders_are_kept_and_compared() -> None:
    source = "Copy %s to %(dest)s: %d of {0} (%1) 100%%"
    assert clean_text(source, "en") == source
    assert placeholders(source) == ["%(dest)s", "%1", "%d", "%s", "{0}"]
    assert placeholders("%2$s の %1$d") == ["%d", "%s"]  # reordered arguments still match
    assert placeholders("100% sure") == []
    assert keep_pair("Copy %s to %s", "%2$s に %1$s をコピー", "ja") is None
    assert keep_pair("1 day ago", "%d日前", "ja") == "placeholder_mismatch"


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        ("Open the file", "ファイルを開く", None),
        ("", "開く", "empty"),
        ("translator-credits", "山田太郎 <taro@example.jp>", "credits"),
        ("translator_credits", "Taro", "credits"),
        ("Your names", "山田太郎", "credits"),
        ("Your emails", "taro@example.jp", "credits"),
        ("TRANSLATORS", "Taro", "credits"),
        ("Translators", "相花 毅 Ryo Nakano", "credits"),
        ("Translators", "翻訳者", None),  # a real label
        ("GNOME", "GNOME", "same"),
        ("x" * 201, "長い", "too_long"),
        ("Open", "開" * 201, "too_long"),
        ("%s: %s", "%s: %s。", "format_only"),
        ("<b>%s</b>", "<b>%s</b> ", "format_only"),
        ("<Any>", "<いずれか>", None),
        ("foo_bar", "フー", "code"),
        ("gtk-ok", "OK", "code"),
        ("fooBar", "フー", "code"),
        ("org.gnome.Foo", "フー", "code"),
        ("https://example.org", "例", "code"),
        ("/usr/share/foo", "フー", "code"),
        ("--help", "ヘルプ", "code"),
        ("kilogram;kilograms;kg", "kilogram;kilograms;kg;キログラム", "code"),
        ("read-only", "読み取り専用", None),
        ("(default)", "(デフォルト)", None),
        ("file(s)", "ファイル", None),
        ("Ordered list", "<OL>", "no_target_script"),
        ("Decimal places. The number of fixed decimal places that are to be displayed.", "桁数。", "length_ratio"),
    ],
)
def test_keep_pair(source: str, target: str, reason: str | None) -> None:
    assert keep_pair(source, target, "ja") == reason


def test_keep_pair_german() -> None:
    assert keep_pair("Translated by", "Übersetzung von", "de") is None
    assert keep_pair("Your name", "Dein Name", "de") is None
    assert keep_pair("Translators", "Thomas Diehl, Frederik Schwarzer", "de") == "credits"
    assert keep_pair("Ordered list", "Geordnete Liste", "de") is None  # no_target_script is for CJK only
    assert keep_pair("Status", "Status", "de") == "same"


def test_cjk_width_ratio_keeps_a_good_japanese_pair() -> None:
    source, target = "Automatically check for updates at startup", "起動時に更新を自動確認"
    assert display_width(target) == 2 * len(target)
    plain_ratio = (len(source) + RATIO_SMOOTHING) / (len(target) + RATIO_SMOOTHING)
    assert plain_ratio > MAX_WIDTH_RATIO  # counting characters would drop it
    assert keep_pair(source, target, "ja") is None
    assert keep_pair("Up", "上へ移動", "ja") is None  # short labels: the smoothing


def test_is_code_leaves_words_alone() -> None:
    assert not is_code("E-mail")
    assert not is_code("TCP/IP")
    assert not is_code("Open the foo_bar file")
    assert is_code("MaskLayer")


# --- split ----------------------------------------------------------------------------------------------------------


def test_split_is_deterministic_and_by_normalized_source() -> None:
    sources = [f"Message number {i}" for i in range(20000)]
    splits = [split_of(s) for s in sources]
    assert splits == [split_of(s) for s in sources]
    assert {"train", "dev", "test"} <= set(splits)
    assert 0.009 < splits.count("test") / len(splits) < 0.015
    assert split_key("Open File...") == split_key("open file") == split_key("Open  File:")
    assert split_of("Open File...") == split_of("open file")


def test_split_keeps_every_translation_of_a_source_together() -> None:
    pairs = [(f"Item {i}", f"項目 {i}{variant}") for i in range(3000) for variant in ("", "です")]
    by_split: dict[str, set[str]] = {"train": set(), "dev": set(), "test": set()}
    for source, _ in pairs:
        by_split[split_of(source)].add(source)
    assert not by_split["train"] & by_split["dev"]
    assert not by_split["train"] & by_split["test"]
    assert not by_split["dev"] & by_split["test"]


# --- .mo files and paths --------------------------------------------------------------------------------------------


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


# --- reading .debs and building -------------------------------------------------------------------------------------

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")


def make_deb(root: Path, out_dir: Path, package: str, files: dict[str, bytes], links: dict[str, str]) -> Path:
    """Build a tiny .deb holding ``files`` (path → bytes) and symbolic ``links`` (path → target)."""
    tree = root / package
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: Test <t@example.org>\nDescription: x\n"
    )
    for path, data in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(data)
    for path, target in links.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).symlink_to(target)
    deb = out_dir / f"{package}_1.0-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)], check=True, capture_output=True
    )
    return deb


@pytest.fixture
def debs(tmp_path: Path) -> Path:
    out = tmp_path / "debs"
    out.mkdir()
    copyright_text = (
        b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: GPL-2+\n"
    )
    ja = write_mo([("_Open", "開く(_O)"), ("Quit", "終了"), ("translator-credits", "山田"), ("GNOME", "GNOME")])
    make_deb(
        tmp_path / "src",
        out,
        "gnome-foo",
        {
            "usr/share/locale/ja/LC_MESSAGES/foo.mo": ja,
            "usr/share/locale/ja_JP/LC_MESSAGES/bar.mo": write_mo([("Close window", "ウィンドウを閉じる")]),
            "usr/share/locale/de/LC_MESSAGES/foo.mo": write_mo([("_Open", "Ö_ffnen")]),
            "usr/share/doc/gnome-foo/copyright": copyright_text,
        },
        {"usr/share/locale/ja/LC_TIME/foo.mo": "../LC_MESSAGES/foo.mo"},
    )
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("ja/messages.mo", write_mo([("Add books", "本を追加"), ("Quit", "終了")]))
        archive.writestr("de/messages.mo", write_mo([("Add books", "Bücher hinzufügen")]))
    make_deb(
        tmp_path / "src",
        out,
        "calibre",
        {
            "usr/share/calibre/localization/locales.zip": zipped.getvalue(),
            "usr/lib/libreoffice/program/resource/ja/LC_MESSAGES/sw.mo": write_mo([("Insert ~Table", "表の挿入(~T)")]),
        },
        {"usr/share/doc/calibre": "gnome-foo"},
    )
    return out


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


@needs_dpkg
def test_build_writes_deterministic_splits(debs: Path, tmp_path: Path) -> None:
    summary = build("en-ja", debs, tmp_path / "a")
    build("en-ja", debs, tmp_path / "b", command=summary["command"])
    for name in ("train.tsv", "dev.tsv", "test.tsv", "dropped.tsv", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name

    rows = [row for split in ("train", "dev", "test") for row in read_tsv(tmp_path / "a" / f"{split}.tsv")]
    assert sorted(rows) == [
        ("Add books", "本を追加", "calibre"),
        ("Close window", "ウィンドウを閉じる", "gnome-foo"),
        ("Insert Table", "表の挿入", "calibre"),
        ("Open", "開く", "gnome-foo"),
        ("Quit", "終了", "calibre,gnome-foo"),
    ]
    for split in ("train", "dev", "test"):
        for line in (tmp_path / "a" / f"{split}.tsv").read_text(encoding="utf-8").splitlines():
            assert line.count("\t") == 2
    assert summary["dropped"]["credits"] == 1 and summary["dropped"]["same"] == 1
    assert summary["packages"]["gnome-foo"] == {"pairs": 3, "license": "GPL-2+", "licenses": ["GPL-2+"]}
    assert summary["packages"]["calibre"]["license"] == "see gnome-foo"
    assert summary["debs"] == ["calibre_1.0-1_all.deb", "gnome-foo_1.0-1_all.deb"]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["total_pairs"] == 5

    german = build("en-de", debs, tmp_path / "de")
    assert german["total_pairs"] == 2  # "_Open" → "Ö_ffnen" becomes Open → Öffnen; "Add books"
