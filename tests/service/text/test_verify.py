"""The check of a restored translation, and what cleaning leaves of a broken one."""

from __future__ import annotations

from service.text.spans import find_spans, mask
from service.text.verify import cleaned, problems

SOURCE = "<b>zoom</b>: scroll, <b>pan</b>: drag (%d%%) at 60%"
MASKED = mask(SOURCE, find_spans(SOURCE))


def test_a_whole_translation_has_no_problem() -> None:
    assert MASKED.text == "{0}zoom{1}: scroll, {2}pan{3}: drag ({4}) at {5}%"
    assert problems(MASKED, "<b>ズーム</b>: スクロール、<b>パン</b>: ドラッグ (%d%%) 60%") == []


def test_each_kind_of_breakage_is_named() -> None:
    assert problems(MASKED, "<b>ズーム</b> <b>パン</b> %d%% 60 {4") == ["fragments", "numbers"]  # its digit too
    assert problems(MASKED, "<b>ズーム</b> <b>パン</b> (%d%%) 60 {lgreset}") == ["fragments"]
    assert problems(MASKED, "<b>ズーム</b> <b>パン</b> 60") == ["spans"]  # %d%% lost
    assert problems(MASKED, "<b>ズーム</b><b>ズーム</b> <b>パン</b> %d%% 60") == ["spans", "tags"]
    assert problems(MASKED, "</b>ズーム<b> <b>パン</b> %d%% 60") == ["tags"]  # the same tags, not nested so
    assert problems(MASKED, "<b>ズーム</b> <b>パン</b> %d%% 60 1/30") == ["numbers"]  # made up
    assert problems(MASKED, "<b>ズーム</b> <b>パン</b> %d%% 60 ３") == ["numbers"]  # full-width digits too


def test_cleaning_cuts_broken_stand_ins_span_texts_and_made_up_numbers() -> None:
    assert cleaned("ズーム {4 回転 7} {lgreset} <b> 1/30 リセット", MASKED) == "ズーム 回転 / リセット"
