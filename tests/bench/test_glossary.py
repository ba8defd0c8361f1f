"""bench/glossary.py: mining a glossary from parallel lines, scoring term keeping, and constrained decoding's
guarantee (every term in the output) on the tiny bundle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from glossary import (
    Constraint,
    Row,
    State,
    by_fallback,
    choose,
    constrained,
    kept_as_words,
    kept_rate,
    lines_with_terms,
    mine,
    spaced,
    term_ids,
    terms_of,
)

from service.serving.engine import Engine
from service.settings import Settings


def test_terms_skip_stopword_edges_short_words_and_punctuation() -> None:
    terms = terms_of("Open the selected file, then save it")
    assert {"Open", "selected", "selected file", "file", "save"} <= terms
    assert "the selected" not in terms  # starts with a stopword
    assert "file then" not in terms  # not separated by a single space
    assert "it" not in terms and "save it" not in terms


def test_mining_keeps_consistent_specific_terms_only() -> None:
    pairs = [(f"Open file {i}", f"ファイル{i}を開く") for i in range(60)]
    pairs += [(f"Open folder {i}", f"フォルダ{i}を開く") for i in range(60)]
    pairs += [(f"Close window {i}", ("ウィンドウ" if i % 2 else "窓") + f"{i}を閉じる") for i in range(60)]
    pairs += [(f"Close tab {i}", f"タブ{i}を閉じる") for i in range(60)]
    pairs += [(f"Printer {i}", f"プリンタ{i}") for i in range(10)]  # too rare
    glossary = mine(pairs, min_lines=50, consistency=0.8, min_dice=0.7)
    assert glossary["file"] == "ファイル"  # not を開く: that also goes with "folder"
    assert glossary["Open"] == "を開く"
    assert "window" not in glossary  # translated two ways; を閉じる in all its lines, but also with "tab"
    assert "Printer" not in glossary


def test_rows_hold_glossary_terms_and_no_other_span() -> None:
    pairs = [("Open file", "ファイルを開く"), ("Open %s file", "%s ファイルを開く"), ("Quit", "終了")]
    rows = lines_with_terms(pairs, {"file": "ファイル"})
    assert [r.source for r in rows] == ["Open file"]
    assert rows[0].terms == [(5, 9, "ファイル")]


def test_kept_rate_counts_each_occurrence_and_spaces() -> None:
    rows = [Row("file and file", "ファイルとファイル", [(0, 4, "ファイル"), (9, 13, "ファイル")])]
    assert kept_rate(rows, ["ファイルとファイル"]) == 100
    assert kept_rate(rows, ["ファイルと書類"]) == 50
    assert spaced(rows, ["ファイル と ファイル"]) == 100 and spaced(rows, ["ファイルとファイル"]) == 0


@pytest.fixture(scope="module")
def engine(tiny_bundle: Path) -> Engine:
    return Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle], threads=1))


def test_choose_forces_where_attention_reaches_at_the_end_and_when_only_the_terms_fit(engine: Engine) -> None:
    tok, spec = engine.tokenizer, engine.bundle.spec
    logits = np.zeros(spec.vocab_size, np.float32)
    logits[7] = 1
    st = State([Constraint(2, 4, [11, 12], "x")], max_length=20)
    assert choose(st, tok, logits.copy(), 0) == 7  # attention elsewhere: the model's choice
    assert [choose(st, tok, logits.copy(), 3), choose(st, tok, logits.copy(), 0)] == [11, 12]
    assert not st.pending and st.met["x"] == 1
    eos = logits.copy()
    eos[spec.eos_id] = 2
    st = State([Constraint(2, 4, [11], "x")], max_length=20)
    assert choose(st, tok, eos.copy(), None) == 11 and choose(st, tok, eos.copy(), None) == spec.eos_id
    st = State([Constraint(2, 4, [11, 12], "x")], max_length=4, tokens=[7])  # two slots left before </s>'s
    assert choose(st, tok, logits.copy(), None) == 11


def test_the_gate_lets_a_sure_model_keep_its_token(engine: Engine) -> None:
    tok, spec = engine.tokenizer, engine.bundle.spec
    sure = np.full(spec.vocab_size, -30, np.float32)
    sure[7] = 0  # probability about 1
    st = State([Constraint(2, 4, [11], "x")], max_length=20)
    assert choose(st, tok, sure.copy(), 3, gate=0.5) == 7 and st.pending
    unsure = np.zeros(spec.vocab_size, np.float32)
    unsure[7] = 1
    assert choose(st, tok, unsure.copy(), 3, gate=0.5) == 11 and not st.pending


def test_written_terms_count_per_occurrence() -> None:
    st = State([Constraint(0, 1, [1], "ab"), Constraint(2, 3, [1], "ab")], max_length=9)
    st.written("xab")
    assert len(st.pending) == 1 and st.met["ab"] == 1
    st.written("xab")  # the same text again meets nothing more
    assert len(st.pending) == 1
    st.written("xabab")
    assert not st.pending


@pytest.mark.parametrize("attention", [True, False])
def test_constrained_decoding_puts_every_term_in_the_output(engine: Engine, attention: bool) -> None:
    tok = engine.tokenizer
    terms = ["ファイル", "設定"]
    assert all(tok.decode(term_ids(tok, t)) == t for t in terms)
    rows = [
        Row("Open the file", "", [(9, 13, "ファイル")]),
        Row("Save the settings of this file now", "", [(9, 17, "設定"), (26, 30, "ファイル")]),
        Row("file", "", [(0, 4, "ファイル")]),
    ]
    hyps = constrained(engine.runners.exact, tok, rows, attention)
    assert kept_rate(rows, hyps) == 100
    assert all(h.count("ファイル") >= 1 for h in hyps)


def test_the_model_first_then_masking_keeps_every_term(engine: Engine) -> None:
    glossary = {"file": "ファイル", "settings": "設定"}
    rows = lines_with_terms([("Open the file", ""), ("Save the settings of this file now", "")], glossary)
    assert len(rows) == 2
    assert kept_rate(rows, by_fallback(engine, rows, glossary)) == 100


def test_kept_as_words_counts_terms_not_glued_into_a_longer_word() -> None:
    rows = [Row("Open file", "ファイルを開く", [(5, 9, "ファイル")])]
    assert kept_as_words(rows, ["ファイルを開く"]) == 100
    assert kept_as_words(rows, ["開く"]) == 0
    assert kept_as_words([Row("Open", "開く", [(0, 4, "開")])], ["開く"]) == 0  # inside the word 開く
