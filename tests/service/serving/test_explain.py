"""/attention's engine path (``Engine.attention_now``, the command line's) gives /translate's translation
(``Engine.translate_now``) and each segment's weights, on the tiny bundle and on the shipped en→ja model; segments
whose stand-ins the model breaks are recovered as /translate recovers them, with the weights of the decode that
answered."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest

from service.serving.budget import answer_bytes, request_bytes
from service.serving.engine import Engine
from service.serving.restoring import PATHS
from service.serving.translation import AttentionResult, Filters, Options
from service.settings import Settings
from service.text.pipeline import TextPipeline
from service.text.verify import problems
from tests.service.mangler import MANGLED, mangler_engine

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
    result = tiny.attention_now([text], options, Filters())[0]
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
    result = shipped.attention_now([text], Options(), Filters(kinds=["cross"]))[0]
    assert result.text == translated == "選択したファイルを開く\n"
    (segment,) = result.segments
    assert segment.source_tokens == ["▁Open", "▁the", "▁selected", "▁file", "</s>"]
    assert "".join(segment.target_tokens).replace("▁", "").removesuffix("</s>") == "選択したファイルを開く"
    assert result.text[slice(*segment.target)] == "選択したファイルを開く" and segment.source == (0, 22)


@pytest.mark.parametrize(
    "text", ["Open %s in {0}\n\nSave <b>all</b> files.", "  Delete the selected files?\nThis cannot be undone. "]
)
def test_shipped_model_spans_and_lines(shipped: Engine, text: str) -> None:
    result = shipped.attention_now([text], Options(), Filters(kinds=["cross"], layers=[0]))[0]
    assert result.text == shipped.translate_now([text], Options())[0].text
    assert len(result.segments) == 2


def test_forced_segments_are_the_target_laid_out(tiny: Engine) -> None:
    tok = tiny.tokenizer
    result = tiny.attention_now(["Open %s\nSave the file"], Options(), Filters(), ["%s を開く\nファイルを保存"])[0]
    assert [s.target_tokens for s in result.segments] == [
        tok.pieces(tok.encode_target("{0} を開く")),
        tok.pieces(tok.encode_target("ファイルを保存")),
    ]
    first, second = result.segments
    assert result.text[slice(*second.target)] == "ファイルを保存" and "%s" in result.text[slice(*first.target)]
    for segment in result.segments:  # rows of forced steps sum to 1 too
        np.testing.assert_allclose(segment.weights["cross"].sum(-1), 1.0, atol=1e-5)


MULTI_TAG = "<b>zoom</b>: scroll, <b>pan</b>: shift+drag, <b>rotate</b>: ctrl+drag, <b>reset</b>: double-click (%d%%)"
NUMBERS = "Receives 60% defense on sand and 30% in water"


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("text", [MULTI_TAG, NUMBERS])
def test_broken_segments_are_recovered_as_translate_recovers_them(shipped: Engine, text: str, beam: int) -> None:
    (translated,) = shipped.translate_now([text], Options(beam_size=beam, details=True))
    result = shipped.attention_now([text], Options(beam_size=beam), Filters(kinds=["cross"]))[0]
    assert result.text == translated.text
    (segment,) = result.segments
    assert translated.details is not None and segment.spans == translated.details.spans
    assert segment.target_tokens == translated.details.tokens  # the tokens of the decode that answered
    (prepared,) = shipped.text.segmented(text).segments
    assert prepared.masked is not None and problems(prepared.masked, result.text) == [], result.text
    if text == MULTI_TAG:
        assert segment.spans in PATHS[1:]  # the first decode broke its stand-ins ("{4rotate", "{lgreset}")
    forced, ids = shipped.runners.forced, {p: i for i, p in shipped.tokenizer.pieces_by_id.items()}
    assert forced is not None  # the weights are a teacher-forced pass over the answering tokens
    source, target = [ids[p] for p in segment.source_tokens], [ids[p] for p in segment.target_tokens]
    (rows,) = forced.cross_attention([source], [target])  # (T, L, h, S)
    np.testing.assert_allclose(segment.weights["cross"], rows.transpose(1, 2, 0, 3), atol=1e-4)


def _appended_only(*args: object, **kwargs: object) -> str:
    return "A {lg} B %s"  # every placement broken: only appending is left


@pytest.mark.parametrize(
    ("options", "broken", "path", "text", "tokens"),
    [
        (Options(), False, "constrained", "A %s", ["▁A", "▁{", "0", "}", "</s>"]),  # the constrained decode's
        (Options(max_length=3), False, "attention", "%s A lg", ["▁A", "▁{", "lg"]),  # too short to constrain
        (Options(), True, "appended", "A B %s", ["▁A", "▁{", "lg", "}", "▁B", "▁7", "</s>"]),
    ],
)
def test_each_recovery_path_answers_with_the_weights_of_its_decode(
    options: Options, broken: bool, path: str, text: str, tokens: list[str]
) -> None:
    engine = mangler_engine()
    with patch.object(TextPipeline, "restored", _appended_only) if broken else nullcontext():
        (translated,) = engine.translate_now(["C %s C"], replace(options, details=True))
        result = engine.attention_now(["C %s C"], options, Filters())[0]
    assert translated.details is not None and (translated.details.spans, translated.text) == (path, text)
    (segment,) = result.segments
    assert (result.text, segment.spans, segment.target_tokens) == (text, path, tokens)
    assert segment.target_tokens == translated.details.tokens
    assert segment.decoder_input_tokens == ["<pad>", *tokens[:-1]]
    cross = segment.weights["cross"]  # the Mangler's every step looks at the source's second token
    assert cross.shape == (1, 2, len(tokens), len(segment.source_tokens)) and np.all(cross[..., 1] == 1)
    if path != "constrained":  # the model's tokens, its text cleaned and the span placed: not their concatenation
        assert engine.tokenizer.decode([MANGLED[i] for i in range(len(tokens))]) != result.text


def test_a_forced_target_is_neither_checked_nor_recovered() -> None:
    engine = mangler_engine()
    result = engine.attention_now(["C %s C"], Options(), Filters(), ["A %s B 7"])[0]
    assert engine.translate_now(["C %s C"], Options())[0].text == "A %s"  # recovered on /translate
    assert result.text == "A %s B 7"  # a made-up number, a broken text on /translate, kept: the caller's answer
    (segment,) = result.segments
    assert segment.spans is None and segment.target_tokens == ["▁A", "▁{0}", "▁B", "▁7", "</s>"]


def test_the_budget_is_held_once_with_room_for_a_re_decode_of_each_segment_with_spans() -> None:
    engine = mangler_engine()
    held: list[int] = []
    hold = engine.budget.hold

    def recorded(size: int, deadline: float) -> AbstractAsyncContextManager[None]:
        held.append(size)
        return hold(size, deadline)

    async def explained(text: str) -> AttentionResult:
        await engine.start()
        try:
            with patch.object(engine.budget, "hold", recorded):
                return (await engine.attention([text], Options(), Filters()))[0]
        finally:
            await engine.stop()

    assert asyncio.run(explained("C %s C")).segments[0].spans == "constrained"  # two decodes, one hold
    assert asyncio.run(explained("C C")).segments[0].spans is None
    spans, plain = (engine._attention_requests(t, Options(), Filters(), None)[1][0] for t in ("C %s C", "C C"))
    spec = engine.bundle.spec
    assert held == [
        2 * request_bytes(spans, spec) + answer_bytes(spec, spans, Filters()),
        request_bytes(plain, spec) + answer_bytes(spec, plain, Filters()),
    ]
