"""Where each segment of a text stands: in the text (``Prepared.offsets``) and in the translation that
``Prepared.finish`` joins (``Prepared.placed``); a plain text as one segment (``TextPipeline.segmented``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime.bundle import load_bundle
from service.text.pipeline import TextPipeline

TEXTS = [
    "Open the selected file\n",
    "  Save %s as {name}\r\n\n\tClose <b>all</b> windows.  ",
    "Delete the selected files? This cannot be undone. Are you sure you want to continue?\nDone.",
    "Open the selected file",
]


@pytest.fixture(scope="module")
def pipeline(tiny_bundle: Path) -> TextPipeline:
    return TextPipeline(load_bundle(tiny_bundle).tokenizer, "en", 40)


@pytest.mark.parametrize("text", TEXTS)
def test_offsets_cut_out_each_segment_of_the_text(pipeline: TextPipeline, text: str) -> None:
    prepared = pipeline.segmented(text)
    assert len(prepared.offsets) == len(prepared.segments) >= 1
    bodies = [text[start:end] for start, end in prepared.offsets]
    for body, segment in zip(bodies, prepared.segments, strict=True):
        assert body == body.strip() and body
        assert segment.source == body if segment.masked is None else segment.masked.text != body
    assert [start for start, _ in prepared.offsets] == sorted(start for start, _ in prepared.offsets)
    assert "".join(c for c in text if not c.isspace()) == "".join(c for b in bodies for c in b if not c.isspace())


@pytest.mark.parametrize("text", TEXTS)
def test_placed_finds_each_segment_in_the_joined_translation(pipeline: TextPipeline, text: str) -> None:
    prepared = pipeline.segmented(text)
    outputs = [f"〈{i}〉" * (i + 1) for i in range(len(prepared.segments))]  # of different lengths
    ((joined, _),) = prepared.finish([[o] for o in outputs], 0)
    (places,) = prepared.placed(outputs)
    assert [joined[start:end] for start, end in places] == outputs


def test_a_plain_text_is_one_segment_and_long_lines_are_sentences(pipeline: TextPipeline) -> None:
    plain = pipeline.segmented("Open the selected file")
    assert [s.plain for s in plain.segments] == [True] and plain.offsets == [(0, 22)]
    text = TEXTS[2]
    assert [text[a:b] for a, b in pipeline.segmented(text).offsets] == [
        "Delete the selected files?",
        "This cannot be undone.",
        "Are you sure you want to continue?",
        "Done.",
    ]


def test_a_japanese_glossary_term_is_masked_in_unspaced_text(tiny_bundle: Path) -> None:
    ja = TextPipeline(load_bundle(tiny_bundle).tokenizer, "ja", 40)
    (segment,) = ja.segmented("設定ファイルを開く", {"設定ファイル": "configuration file"}).segments
    assert segment.masked is not None
    assert segment.masked.text.startswith("{0}を") and segment.masked.outputs[0] == "configuration file"
