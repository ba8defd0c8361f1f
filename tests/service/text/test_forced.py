"""A forced target cut as its source was (lines, sentences) and masked with the source's stand-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import LayoutMismatch
from service.runtime.bundle import load_bundle
from service.text.forced import forced_targets, masked_like
from service.text.pipeline import TextPipeline
from service.text.spans import find_spans, mask


@pytest.fixture(scope="module")
def pipeline(tiny_bundle: Path) -> TextPipeline:
    return TextPipeline(load_bundle(tiny_bundle).tokenizer, "en", 40)


def test_lines_and_sentences_are_forced_to_their_parts_of_the_target(pipeline: TextPipeline) -> None:
    text = "  Open %s\n\nDelete the selected files? This cannot stay open.\n"  # letters of the tiny vocabulary
    prepared = pipeline.segmented(text)
    assert [s.source for s in prepared.segments] == [
        "Open {0}",
        "Delete the selected files?",
        "This cannot stay open.",
    ]
    target = "%s を開く\r\n選択したファイルを削除しますか？元に戻せません。"  # its own whitespace, no empty line
    assert forced_targets(prepared, target, "ja") == [
        "{0} を開く",
        "選択したファイルを削除しますか？",
        "元に戻せません。",
    ]
    assert forced_targets(pipeline.segmented("Open file"), "ファイルを開く\n", "ja") == ["ファイルを開く"]


@pytest.mark.parametrize(
    ("text", "target", "needle"),
    [
        ("Open file\nSave", "ファイルを開く", "target_text has 1 lines with text where q has 2"),
        ("Open file", "ファイルを\n開く", "target_text has 2 lines with text where q has 1"),
        (
            "Delete the selected files? This cannot be undone.",
            "選択したファイルを削除します。",
            "line 1 of target_text (counting lines with text) has 1 sentences where q's has 2",
        ),
    ],
)
def test_a_target_laid_out_otherwise_is_refused_naming_the_mismatch(
    pipeline: TextPipeline, text: str, target: str, needle: str
) -> None:
    with pytest.raises(LayoutMismatch, match=needle.replace("?", r"\?").replace("(", r"\(").replace(")", r"\)")):
        forced_targets(pipeline.segmented(text), target, "ja")


def test_each_group_takes_its_first_free_occurrence_in_any_order() -> None:
    source = "Move {1} to {0} as <b>%s</b>"
    masked = mask(source, find_spans(source))
    assert (masked.text, masked.outputs) == ("Move {0} to {1} as {2}", ["{1}", "{0}", "<b>%s</b>"])
    assert masked_like(masked, "{0} に {1} を移動") == "{1} に {0} を移動"
    swapped = mask("{x} and {x}", find_spans("{x} and {x}"))
    assert masked_like(swapped, "{x} と {x}") == "{0} と {1}"
    assert masked_like(masked, "移動") == "移動"  # a group the target lacks stays missing
