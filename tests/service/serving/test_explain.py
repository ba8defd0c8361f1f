"""/attention's engine path (``Engine.attention_now``, the command line's) gives /translate's translation
(``Engine.translate_now``) and each segment's weights, on the tiny bundle and on the shipped en→ja model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.serving.engine import Engine
from service.serving.translation import Filters, Options
from service.settings import Settings

SHIPPED = Path(__file__).resolve().parents[3] / "model" / "bundles" / "en-ja"
TEXTS = [
    "Open the selected file\n",
    "\tSave %s as {name}\r\n\nClose <b>all</b> windows.  ",
    "Delete the selected files? This cannot stay open. Close the window now.\nDone",
    "Open the selected file",
]


@pytest.fixture(scope="module")
def tiny(tiny_bundle: Path) -> Engine:
    return Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle], sentence_split_chars=40))


@pytest.fixture(scope="module")
def shipped() -> Engine:
    return Engine.load(SHIPPED, Settings(bundles=[SHIPPED]))


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("text", TEXTS)
def test_attention_gives_the_translation_that_translate_gives(tiny: Engine, text: str, beam: int) -> None:
    options = Options(beam_size=beam)
    result = tiny.attention_now(text, options, Filters())
    assert result.text == tiny.translate_now([text], options)[0].text
    prepared = tiny.text.segmented(text)
    assert [s.source for s in result.segments] == prepared.offsets
    assert [s.model_input for s in result.segments] == [s.source for s in prepared.segments]
    for segment in result.segments:
        S, T = len(segment.source_tokens), len(segment.target_tokens)
        assert segment.weights["cross"].shape == (2, 4, T, S) and segment.weights["encoder"].shape == (2, 4, S, S)
        assert not {"<0x09>", "<0x0A>", "<0x0D>"} & set(segment.source_tokens)  # the layout took them apart


def test_the_issue_example_on_the_shipped_model(shipped: Engine) -> None:
    text = "Open the selected file\n"
    translated = shipped.translate_now([text], Options())[0].text
    result = shipped.attention_now(text, Options(), Filters(kinds=["cross"]))
    assert result.text == translated == "選択したファイルを開く\n"
    (segment,) = result.segments
    assert segment.source_tokens == ["▁Open", "▁the", "▁selected", "▁file", "</s>"]
    assert "".join(segment.target_tokens).replace("▁", "").removesuffix("</s>") == "選択したファイルを開く"
    assert result.text[slice(*segment.target)] == "選択したファイルを開く" and segment.source == (0, 22)


@pytest.mark.parametrize(
    "text", ["Open %s in {0}\n\nSave <b>all</b> files.", "  Delete the selected files?\nThis cannot be undone. "]
)
def test_shipped_model_spans_and_lines(shipped: Engine, text: str) -> None:
    result = shipped.attention_now(text, Options(), Filters(kinds=["cross"], layers=[0]))
    assert result.text == shipped.translate_now([text], Options())[0].text
    assert len(result.segments) == 2


def test_forced_segments_are_the_target_laid_out(tiny: Engine) -> None:
    tok = tiny.tokenizer
    result = tiny.attention_now("Open %s\nSave the file", Options(), Filters(), "%s を開く\nファイルを保存")
    assert [s.target_tokens for s in result.segments] == [
        tok.pieces(tok.encode_target("{0} を開く")),
        tok.pieces(tok.encode_target("ファイルを保存")),
    ]
    first, second = result.segments
    assert result.text[slice(*second.target)] == "ファイルを保存" and "%s" in result.text[slice(*first.target)]
    for segment in result.segments:  # rows of forced steps sum to 1 too
        np.testing.assert_allclose(segment.weights["cross"].sum(-1), 1.0, atol=1e-5)
