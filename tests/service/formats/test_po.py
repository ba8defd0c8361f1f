"""Gettext catalogs filled as translate-po and /translate_file do, with a fake translator: what is filled, what is
kept, plural forms by language, format directives, and msgfmt's verdict on the result."""

from __future__ import annotations

import asyncio
from pathlib import Path

import polib
import pytest

from service.errors import UnreadableFile
from service.formats import po
from service.formats.base import Translate
from tests.service.catalogs import EMPTY_SLOTS, TEMPLATE, msgfmt_check


def marked(texts: list[str]) -> list[str | None]:
    """A translator that keeps every directive: «text» in brackets."""
    return [f"「{t}」" for t in texts]


async def keeping(texts: list[str]) -> list[str | None]:
    return marked(texts)


async def losing(texts: list[str]) -> list[str | None]:
    """A translator that drops every directive, as a model can."""
    return ["翻訳" for _ in texts]


def run(translate: Translate, target: str = "ja", fuzzy: bool = True, text: str = TEMPLATE) -> tuple[str, po.Report]:
    catalog = po.parse(text.encode())
    report = asyncio.run(po.translate_catalog(catalog, translate, target, fuzzy))
    return str(catalog), report


def test_every_empty_msgstr_is_filled_and_the_rest_kept(tmp_path: Path) -> None:
    out, report = run(keeping)
    assert report == po.Report(filled=EMPTY_SLOTS, kept_source=0)
    catalog = polib.pofile(out)
    assert catalog.metadata["Language"] == "ja"
    assert catalog.metadata["Plural-Forms"] == "nplurals=1; plural=0;"  # babel's table, not the template's
    assert catalog.metadata["Project-Id-Version"] == "demo 1.0"
    assert "Content-Type: text/plain; charset=UTF-8" in out
    assert catalog.header.startswith("SOME DESCRIPTIVE TITLE.")
    entries = {(e.msgctxt, e.msgid): e for e in catalog}
    assert entries[("menu", "Save")].msgstr == "保存" and "fuzzy" not in entries[("menu", "Save")].flags
    opened = entries[(None, "Open %s")]
    assert opened.msgstr == "「Open %s」"
    assert opened.flags == ["fuzzy", "c-format"] and opened.comment.startswith("TRANSLATORS")
    assert opened.occurrences == [("src/main.c", "10")]
    usage = entries[(None, "\nUsage: demo [options]\n\n  --help   show this help\n")]
    assert usage.msgstr == "\n「Usage: demo [options]」\n\n  「--help   show this help」\n"  # lines, blanks, indent
    assert entries[(None, "Settings ")].msgstr == "「Settings」 "  # surrounding spaces kept
    assert entries[(None, "Close")].flags == ["fuzzy"]
    plural = entries[(None, "One file")]
    assert plural.msgstr_plural == {0: "「%d files」"}  # Japanese: one form, the plural's; msgstr[1] removed
    assert [e.msgstr for e in catalog.obsolete_entries()] == ["古い項目"]
    path = tmp_path / "ja.po"
    path.write_text(out)
    msgfmt_check(path)


def test_no_fuzzy_marks_nothing() -> None:
    out, _ = run(keeping, fuzzy=False)
    catalog = polib.pofile(out)
    assert [e.msgid for e in catalog if "fuzzy" in e.flags] == ["Close"]  # it was fuzzy before


def test_a_lost_directive_keeps_the_source_marked_fuzzy(tmp_path: Path) -> None:
    out, report = run(losing, fuzzy=False)
    catalog = polib.pofile(out)
    entries = {e.msgid: e for e in catalog}
    assert report.kept_source == 3  # Open %s, the python-format one, the plural: the others have no directives
    assert entries["Open %s"].msgstr == "Open %s" and "fuzzy" in entries["Open %s"].flags
    assert entries["One file"].msgstr_plural == {0: "%d files"}
    assert entries["Close"].msgstr == "翻訳"
    assert "fuzzy" not in entries["Settings "].flags
    path = tmp_path / "ja.po"
    path.write_text(out)
    msgfmt_check(path)


@pytest.mark.parametrize(
    ("target", "forms", "plural"),
    [
        ("de", "nplurals=2; plural=(n != 1);", {0: "「One file」", 1: "「%d files」"}),
        ("ru", None, dict.fromkeys(range(3), "「%d files」")),  # form 0 also serves 21, 31, ...
        ("ar", None, {i: "「%d files」" if i != 1 else "「One file」" for i in range(6)}),  # n = 1 is form 1
    ],
)
def test_plural_forms_follow_the_target_language(
    tmp_path: Path, target: str, forms: str | None, plural: dict[int, str]
) -> None:
    out, report = run(keeping, target)
    catalog = polib.pofile(out)
    if forms is not None:
        assert catalog.metadata["Plural-Forms"] == forms
    assert {e.msgid: e for e in catalog}["One file"].msgstr_plural == plural
    assert report.filled == EMPTY_SLOTS - 1 + len(plural)
    path = tmp_path / f"{target}.po"
    path.write_text(out)
    msgfmt_check(path)


def test_a_catalog_s_own_plural_forms_and_translations_are_kept() -> None:
    text = TEMPLATE.replace("Language: \\n", "Language: ja_JP\\n").replace(
        "nplurals=INTEGER; plural=EXPRESSION;", "nplurals=2; plural=(n != 1);"
    )
    text = text.replace('msgstr[0] ""\nmsgstr[1] ""', 'msgstr[0] "ファイル 1 個"\nmsgstr[1] ""')
    out, _ = run(keeping, text=text)
    catalog = polib.pofile(out)
    assert catalog.metadata["Language"] == "ja_JP"
    assert catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert {e.msgid: e for e in catalog}["One file"].msgstr_plural == {0: "ファイル 1 個", 1: "「%d files」"}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"hello world\n", "not a gettext catalog"),
        (b'msgid "a"\nmsgstr "b"\nmsgid "a"\nmsgstr\n', "not a valid gettext catalog"),
        ('msgid "é"\nmsgstr ""\n'.encode("utf-16"), "save it as UTF-8"),
        (b'"Content-Type: text/plain; charset=UTF-8\\n"\nmsgid "\xff"\nmsgstr ""\n', "not readable as UTF-8"),
        (TEMPLATE.replace("Language: \\n", "Language: de\\n").encode(), "for language 'de', not 'ja'"),
    ],
)
def test_unreadable_catalogs_are_refused(data: bytes, needle: str) -> None:
    with pytest.raises(UnreadableFile, match=needle):
        catalog = po.parse(data)
        asyncio.run(po.translate_catalog(catalog, keeping, "ja"))


def test_content_that_names_a_file_is_not_read_as_that_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.po"
    secret.write_text('msgid "secret"\nmsgstr ""\n')
    with pytest.raises(UnreadableFile):
        po.parse(str(secret).encode())  # polib would open it


def test_a_latin1_catalog_is_read_in_its_charset_and_written_as_utf8() -> None:
    text = 'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=ISO-8859-1\\n"\n\nmsgid "Café"\nmsgstr ""\n'
    catalog = po.parse(text.encode("latin-1"))
    asyncio.run(po.translate_catalog(catalog, keeping, "ja"))
    assert {e.msgid: e.msgstr for e in catalog} == {"Café": "「Café」"}
    assert "charset=UTF-8" in str(catalog)


def test_a_line_over_a_limit_stays_english_and_fuzzy() -> None:
    async def refusing(texts: list[str]) -> list[str | None]:
        return [None if t.startswith("--help") else f"「{t}」" for t in texts]

    out, report = run(refusing, fuzzy=False)
    usage = {e.msgid: e for e in polib.pofile(out)}["\nUsage: demo [options]\n\n  --help   show this help\n"]
    assert usage.msgstr == "\n「Usage: demo [options]」\n\n  --help   show this help\n" and "fuzzy" in usage.flags
    assert report == po.Report(filled=EMPTY_SLOTS, kept_source=0, over_limit=1)
