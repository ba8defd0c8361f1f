import itertools

import pytest

from service.text import words as module
from service.text.words import segmenter_name, words

TEXTS = {
    "en": 'Hello, (world)! The C++ "API"... e-mail 3.14  end',
    "ja": "東京タワーでiPhone 15を買いました。「はい」",
    "zh": "我来到北京清华大学，买了iPhone 15。",
    "zt": "我來到台北，買了iPhone。",
    "th": "ผมรักภาษาไทย มากครับ",
    "lo": "ສະບາຍດີ ໂລກ",
}


def surfaces(text: str, lang: str) -> list[str]:
    return [text[a:b] for a, b in words(text, lang)]


@pytest.mark.parametrize("lang", sorted(TEXTS))
def test_words_are_ordered_disjoint_and_cover_every_visible_character(lang: str) -> None:
    text = TEXTS[lang]
    spans = words(text, lang)
    assert all(a < b for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(spans))
    covered = {i for a, b in spans for i in range(a, b)}
    assert covered == {i for i, char in enumerate(text) if not char.isspace()}


def test_spaced_languages_split_edge_punctuation_and_keep_inner() -> None:
    assert surfaces(TEXTS["en"], "en") == [
        "Hello",
        ",",
        "(",
        "world",
        ")!",
        "The",
        "C++",
        '"',
        "API",
        '"...',
        "e-mail",
        "3.14",
        "end",
    ]
    assert surfaces("¿Qué tal?", "es") == ["¿", "Qué", "tal", "?"]
    assert surfaces("...", "de") == ["..."]


def test_unspaced_languages_use_their_segmenter() -> None:
    assert segmenter_name("ja") == "fugashi"
    assert surfaces(TEXTS["ja"], "ja")[:6] == ["東京", "タワー", "で", "iPhone", "15", "を"]
    assert segmenter_name("zh-Hans") == "jieba"
    assert surfaces(TEXTS["zh"], "zh-Hans") == [
        "我",
        "来到",
        "北京",
        "清华大学",
        "，",
        "买",
        "了",
        "iPhone",
        "15",
        "。",
    ]
    assert segmenter_name("th") == "pythainlp"
    assert surfaces(TEXTS["th"], "th") == ["ผม", "รัก", "ภาษาไทย", "มาก", "ครับ"]
    assert segmenter_name("en") == "whitespace"


def test_without_a_segmenter_words_are_runs_of_one_script(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> module.Segmenter:
        raise ImportError("fugashi")

    monkeypatch.setitem(module.SEGMENTERS, "ja", ("fugashi", missing))
    module._segmenter.cache_clear()
    try:
        assert segmenter_name("ja") == "script runs"
        assert surfaces(TEXTS["ja"], "ja") == [
            "東京",
            "タワー",
            "で",
            "iPhone",
            "15",
            "を",
            "買",
            "いました",
            "。「",
            "はい",
            "」",
        ]
    finally:
        module._segmenter.cache_clear()
    assert segmenter_name("lo") == "script runs"
    assert surfaces(TEXTS["lo"], "lo") == ["ສະບາຍດີ", "ໂລກ"]
    assert surfaces("é\u0301a", "km") == ["é\u0301a"]  # a combining mark stays in its word


def test_a_segmenter_that_drops_or_changes_text_falls_back_for_those_characters() -> None:
    assert module._locate("abc 東京xyz", ["abc", "京都", "xyz"]) == [(0, 3), (4, 6), (6, 9)]


@pytest.mark.parametrize("lang", ["en", "ja", "lo"])
def test_a_protected_span_without_whitespace_is_one_word(lang: str) -> None:
    text = "Open %s at https://example.com/a, {0} or a@b.co 3.5"
    assert {"%s", "https://example.com/a", "{0}", "a@b.co", "3.5"} <= set(surfaces(text, lang))
    assert "," in surfaces(text, lang)  # the comma after the URL is not part of it
