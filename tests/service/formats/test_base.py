"""Line-by-line translation, batching and the over-limit fallback; .txt files; the format registry; directives."""

from __future__ import annotations

import asyncio

import pytest

from service.errors import TooLarge, UnreadableFile
from service.formats import accepted, format_for, text
from service.formats.base import batched, cores, rebuild, translate_units
from service.formats.directives import keeps_directives


def test_lines_keep_their_form() -> None:
    source = "\n  Open file\t\n\nSave as…  \r\n"
    assert cores(source) == ["Open file", "Save as…"]
    assert rebuild(source, {"Open file": " 開く ", "Save as…": "保存"}) == "\n  開く\t\n\n保存  \r\n"
    assert rebuild(source, {"Open file": None}) == source  # no translation: the line is kept
    assert cores(" \n\t") == [] and rebuild("", {}) == ""


def test_batches_translate_once_and_fall_back_text_by_text() -> None:
    calls: list[list[str]] = []

    async def call(texts: list[str]) -> list[str]:
        calls.append(texts)
        if any(len(t) > 5 for t in texts):
            raise TooLarge("too long", "max_chars", 5)
        return [t.upper() for t in texts]

    done: list[int] = []
    units = asyncio.run(translate_units(["a\nb", "toolong\na", "c", "d"], batched(call, 2, done.append)))
    assert units == {"a": "A", "b": "B", "toolong": None, "c": "C", "d": "D"}
    assert calls[0] == ["a", "b"] and ["toolong"] in calls and ["c"] in calls  # each distinct text once
    assert sum(done) == 5


def test_txt_files() -> None:
    async def upper(texts: list[str]) -> list[str | None]:
        return [t.upper() for t in texts]

    data = "\ufeffOne\n\n  two  \n".encode()
    assert asyncio.run(text.translate_file(data, upper, "ja")) == b"ONE\n\n  TWO  \n"
    with pytest.raises(UnreadableFile, match="not UTF-8"):
        asyncio.run(text.translate_file(b"caf\xe9", upper, "ja"))


def test_registry_by_extension() -> None:
    assert accepted() == [".html", ".po", ".pot", ".txt"]
    assert format_for("../x/App.PO") is format_for("a.po") is not None
    assert format_for("a.docx") is None and format_for("po") is None


@pytest.mark.parametrize(
    ("source", "translation", "flags", "kept"),
    [
        ("%d files in %s", "%s に %d 個", ["c-format"], False),  # unnumbered: order is the arguments'
        ("%1$s of %2$d", "%2$d の %1$s", ["c-format"], True),
        ("100%% of %s", "%s の 100%%", ["c-format"], True),
        ("Open %s", "開く", ["c-format"], False),
        ("Open %s", "開く", ["no-c-format"], True),
        ("Open %s", "開く", [], True),  # msgfmt checks flagged entries only
        ("%(a)s and %(b)s", "%(b)s と %(a)s", ["python-format"], True),
        ("{n} items", "{n} 個", ["python-brace-format"], True),
        ("{n} items", "{m} 個", ["python-brace-format"], False),
        ("%1 of %2", "%2 の %1", ["kde-format"], True),
        ("%1 of %2", "%1", ["qt-format"], False),
        ("{0} and %s", "{0}", ["lua-format"], False),  # unknown format: printf and brace both
        ("%d files", "%d%%%ト", ["c-format"], False),  # a stray %: msgfmt cannot read it
    ],
)
def test_directives_as_msgfmt_checks_them(source: str, translation: str, flags: list[str], kept: bool) -> None:
    assert keeps_directives(source, translation, flags) is kept
