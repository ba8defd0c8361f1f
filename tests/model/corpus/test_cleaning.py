"""Tests of model/corpus/cleaning.py: accelerators, conventions, placeholders and the keep/drop rules."""

from __future__ import annotations

import pytest

from model.corpus.cleaning import (
    MAX_WIDTH_RATIO,
    RATIO_SMOOTHING,
    clean_pair,
    clean_text,
    display_width,
    is_code,
    keep_pair,
    placeholders,
    strip_accelerators,
)


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
