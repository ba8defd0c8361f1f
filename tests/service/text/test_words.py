"""Words: a segmenter for unspaced languages where one is installed, runs of one script otherwise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.text import words as words_module
from service.text.words import cuts, script_runs, words


def texts(text: str, spans: list[tuple[int, int]]) -> list[str]:
    return [text[a:b] for a, b in spans]


@pytest.fixture
def no_segmenter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(words_module, "segmenter", lambda lang: None)
    yield


def test_japanese_and_chinese_words_from_their_segmenters() -> None:
    text = "ファイルを開くことができませんでした"
    assert texts(text, words(text, "ja"))[:4] == ["ファイル", "を", "開く", "こと"]
    assert texts("打开文件夹失败", words("打开文件夹失败", "zh")) == ["打开", "文件夹", "失败"]
    assert texts("無法開啟檔案", words("無法開啟檔案", "zh-Hant")) == ["無法", "開啟", "檔案"]


def test_without_a_segmenter_runs_of_one_script(no_segmenter: None) -> None:
    text = "Inkscapeのファイルを開く。"
    assert texts(text, words(text, "ja")) == ["Inkscape", "の", "ファイル", "を", "開", "く"]
    assert texts("データー", script_runs("データー")) == ["データー"]  # the prolonged sound mark is katakana's
    assert texts("３個のＦｉｌｅ", script_runs("３個のＦｉｌｅ")) == ["３", "個", "の", "Ｆｉｌｅ"]
    assert texts("เปิดไฟล์ ได้", script_runs("เปิดไฟล์ ได้")) == ["เปิดไฟล์", "ได้"]  # marks stay with their letter


def test_spaced_languages_words_are_runs_of_letters_and_digits() -> None:
    text = "Öffne die Datei „x86_64“, bitte."
    assert texts(text, words(text, "de")) == ["Öffne", "die", "Datei", "x86_64", "bitte"]
    assert cuts("Open files", "en") == frozenset({1, 2, 3, 6, 7, 8, 9})
