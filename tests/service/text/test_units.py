"""service/text's parts alone: layout, sentences, spans found and masked, placement from attention weights."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from service.text.lines import layout
from service.text.placement import Aggregation, piece_positions, positions, restore
from service.text.sentences import sentences
from service.text.spans import find_spans, has_spans, mask
from service.text.words import cuts


@pytest.mark.parametrize(
    "text",
    ["", "   ", "\n", "Open\n", "\n\nOpen the file\n", "  a\n\n  b  \r\n c", "one\ttwo ", "x"],
)
def test_layout_gives_the_text_back_and_keeps_whitespace_out_of_stretches(text: str) -> None:
    lay = layout(text)
    assert lay.join(lay.stretches) == text
    assert all(s == s.strip() and s and "\n" not in s for s in lay.stretches)
    assert lay.join([f"<{s}>" for s in lay.stretches]).replace("<", "").replace(">", "") == text


def test_empty_and_whitespace_texts_have_nothing_to_translate() -> None:
    assert layout("").stretches == [] and layout(" \n\t\n").stretches == []


def test_long_lines_are_cut_into_sentences_that_join_back() -> None:
    line = "Could not open file.txt. Try again, e.g. with sudo. Version 1.2 is required!"
    parts = sentences(line, "en", 10)
    assert "".join(parts) == line
    assert [p.strip() for p in parts] == [
        "Could not open file.txt.",
        "Try again, e.g. with sudo.",
        "Version 1.2 is required!",
    ]
    assert sentences(line, "en", len(line)) == [line]


SPANS = [
    ("Open %s now", ["%s"]),
    ("%d of %5.2f and %1$s, %(name)s, 100%%", ["%d", "%5.2f", "%1$s", "%(name)s", "100", "%%"]),
    ("Receives 60% defense, 1.5 or 2,000 (mp3, x86_64, UTF-8)", ["60", "1.5", "2,000", "mp3", "x86_64", "8"]),
    ("{0} and {name} and {{x}}", ["{0}", "{name}", "{{x}}"]),
    ("Weblate [X7X] marker [X12X]", ["[X7X]", "[X12X]"]),
    ("See https://example.org/a?b=1, or mail me@example.com.", ["https://example.org/a?b=1", "me@example.com"]),
    ("Fish &amp; chips &#169; &#x2014;", ["&amp;", "&#169;", "&#x2014;"]),
    ('Click <a href="/x" title="t">here</a> <br/>', ['<a href="/x" title="t">', "</a>", "<br/>"]),
]


@pytest.mark.parametrize(("text", "found"), SPANS)
def test_spans_are_found(text: str, found: list[str]) -> None:
    assert [s.output for s in find_spans(text)] == found
    assert has_spans(text)


@pytest.mark.parametrize("text", ["Open the file", "a < b > c", "Use & abuse", "Save as…"])
def test_plain_text_has_no_span(text: str) -> None:
    assert find_spans(text) == [] and not has_spans(text)


def test_numbers_are_spans_unless_left_to_the_model() -> None:
    assert [s.kind for s in find_spans("50% of 3 files")] == ["number", "number"]
    assert find_spans("50% of 3 files", numbers=False) == [] and not has_spans("50% of files", numbers=False)
    assert find_spans("mp3 on x86_64", numbers=False) == []


def test_digits_inside_words_are_spans() -> None:
    spans = find_spans("Play mp3 on x86_64 in 3D, v1.2.3, the 2nd and 21st of ３ tries")
    assert [(s.kind, s.output) for s in spans] == [
        ("code", "mp3"), ("code", "x86_64"), ("code", "3D"), ("code", "v1.2.3"), ("number", "2"), ("number", "21"),
        ("number", "３"),
    ]  # fmt: skip


def test_a_positional_parameter_is_one_span_with_its_dollar() -> None:
    """HexChat's "%C18$1": as two spans, "C18" and "1", the model drops the "$" between them and writes "C181"."""
    spans = find_spans("Offering DCC CHAT to %C18$1%O for $2, $1,000 or $5.50")
    assert [(s.kind, s.output) for s in spans] == [
        ("code", "C18"), ("positional", "$1"), ("positional", "$2"), ("number", "1,000"), ("number", "5.50"),
    ]  # fmt: skip


def test_characters_outside_the_vocabulary_are_spans() -> None:
    vocabulary = frozenset("Helo wrd")
    spans = find_spans("Hello 😀😀 world 龘", vocabulary)
    assert [(s.kind, s.output) for s in spans] == [("char", "😀😀"), ("char", "龘")]
    assert has_spans("Hello 😀", vocabulary) and not has_spans("Hello", vocabulary)


def test_glossary_and_kept_terms_are_spans_with_their_output() -> None:
    spans = find_spans("Open Inkscape files in GIMP", glossary={"Inkscape": "インクスケープ"}, keep=["GIMP"])
    assert [(s.kind, s.output) for s in spans] == [("glossary", "インクスケープ"), ("keep", "GIMP")]
    assert find_spans("Inkscapes", glossary={"Inkscape": "x"}) == []  # whole words only


def test_touching_spans_are_one_stand_in() -> None:
    masked = mask("Open <b>%s</b> now %d", find_spans("Open <b>%s</b> now %d"))
    assert masked.text == "Open {0} now {1}"
    assert masked.outputs == ["<b>%s</b>", "%d"] and masked.ordered == [True, True]


def test_stand_in_positions_across_pieces() -> None:
    assert piece_positions(["▁a", "▁{0}", "▁{", "1", "2", "}", "▁b"]) == {0: [1], 12: [2, 3, 4, 5]}
    assert piece_positions(["▁a", "<0x7B>", "3", "}", "<0xE3>", "▁{4}"]) == {3: [1, 2, 3], 4: [5]}  # a byte "{"


def detok(pieces: list[str]) -> str:
    return "".join(pieces).replace("▁", " ").strip()


def test_spans_go_where_attention_puts_them_and_copies_are_dropped() -> None:
    masked = mask("Open %s now {x}", find_spans("Open %s now {x}"))  # "Open {0} now {1}"
    source = ["▁Open", "▁{0}", "▁now", "▁{", "1", "}", "</s>"]
    target = ["▁A", "▁B", "▁{0}", "▁C"]
    weights = np.full((5, 7), 0.01)
    weights[3, 1] = 1.0  # span 0 is read while making "C"
    weights[0, 3:6] = 1.0  # span 1 while making "A"
    places = positions(masked, source, weights, len(target))
    assert places == [3, 0]
    assert restore(masked, target, places, detok) == "{x} A B %s C"


def test_ordered_spans_keep_their_source_order() -> None:
    masked = mask("%s to %s", find_spans("%s to %s"))
    weights = np.zeros((3, 4))
    weights[2, 0] = weights[0, 2] = 1.0  # attention would swap them: the arguments would swap too
    places = positions(masked, ["▁{0}", "▁to", "▁{1}", "</s>"], weights, 3)
    assert places == [0, 2]


def test_a_span_without_a_place_is_appended_never_dropped() -> None:
    masked = mask("Open %s", find_spans("Open %s"))
    assert positions(masked, ["▁Open", "</s>"], np.ones((2, 2)), 1) == [None]  # no stand-in in the source
    assert restore(masked, ["▁A"], [None], detok) == "A%s"
    assert restore(masked, [], positions(masked, ["▁{0}"], np.ones((1, 1)), 0), detok) == "%s"


def test_aggregations() -> None:
    cross = np.random.default_rng(0).random((4, 3, 8, 5))  # (T, L, h, S)
    assert np.allclose(Aggregation("last").apply(cross), cross[:, -1].mean(axis=1))
    assert np.allclose(Aggregation("mean", 3).apply(cross), cross.mean(axis=1)[:, 3])


def test_the_tiny_vocabulary_lets_ordinary_sentences_take_the_fast_path(tiny_bundle: Path) -> None:
    from service.runtime.bundle import load_bundle
    from service.text.pipeline import TextPipeline

    pipeline = TextPipeline(load_bundle(tiny_bundle).tokenizer, "en", 200)
    assert pipeline.plain("Open the selected file")
    assert pipeline.prepare(["Open the selected file", "Save as"]) is None
    assert not pipeline.plain("Open %s") and not pipeline.plain(" Open") and not pipeline.plain("a\nb")


def test_copied_stand_ins_place_their_spans_and_only_lost_ones_need_attention(tiny_bundle: Path) -> None:
    from service.decoding import Hypothesis
    from service.runtime.bundle import load_bundle
    from service.text.pipeline import TextPipeline

    tok = load_bundle(tiny_bundle).tokenizer
    pipeline = TextPipeline(tok, "en", 200)
    prepared = pipeline.prepare(["Open %s now"])
    assert prepared is not None
    (segment,) = prepared.segments
    assert segment.source == "Open {0} now"
    src = tok.encode_source(segment.source)
    copy = Hypothesis(tok.encode_target("now {0} open"), [])
    assert not pipeline.needs_attention(segment, copy)
    assert pipeline.restored(segment, src, copy) == "now %s open"

    lost = Hypothesis(tok.encode_target("now open"), [])
    assert pipeline.needs_attention(segment, lost)
    assert pipeline.restored(segment, src, lost) == "now open%s"  # without attention: appended, never dropped
    stand_in = piece_positions(tok.pieces(src))[0]
    cross = np.full((len(lost.tokens), 2, 2, len(src)), 0.01)
    cross[4, -1, :, stand_in] = 1.0  # read while making "▁" before "open"
    read = Hypothesis(lost.tokens, [], cross_attention=list(cross))
    assert not pipeline.needs_attention(segment, read)
    assert pipeline.restored(segment, src, read) == "now %s open"


def test_glossary_terms_in_unspaced_text_match_whole_words() -> None:
    glossary = {"ファイル": "file", "開": "open", "文件夹": "folder", "开文": "x"}
    ja = find_spans("Inkscapeのファイルを開く", glossary=glossary, inside=partial(cuts, lang="ja"))
    assert [(s.start, s.output) for s in ja] == [(9, "file")]  # "開" alone would cut the word "開く"
    zh = find_spans("打开文件夹失败", glossary=glossary, inside=partial(cuts, lang="zh"))
    assert [(s.start, s.output) for s in zh] == [(2, "folder")]
    assert find_spans("the files", glossary={"file": "Datei"}) == []
    assert [s.output for s in find_spans("file-based", glossary={"file": "Datei"})] == ["Datei"]


def test_every_run_of_digits_is_in_a_span() -> None:
    spans = find_spans("On 2010-07-18 at 12:30, %d24 and ６")
    assert [s.output for s in spans] == ["2010-07-18", "12:30", "%d", "24", "６"]  # "24": no pattern takes it
    assert has_spans("%d24")
