"""Word alignments from cross-attention (service/serving/alignment.py), on hand-made weights and on the shipped
model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from service.errors import NoSuchIndex
from service.serving.alignment import BASELINE, DEFAULT, Alignable, _char_map, _piece_spans, _Segment
from service.serving.engine import Engine
from service.serving.translation import Filters, Options
from service.settings import Settings

SHIPPED = Path(__file__).resolve().parents[3] / "model" / "bundles" / "en-ja"


@pytest.fixture(scope="module")
def shipped() -> Engine:
    return Engine.load(SHIPPED, Settings(bundles=[SHIPPED]))


def words_of(text: str, spans: list[tuple[int, int]]) -> list[str]:
    return [text[a:b] for a, b in spans]


def one_segment(weights: list[list[float]], sources: list[list[int]], targets: list[list[int]]) -> Alignable:
    """An Alignable of one segment whose every layer and head has ``weights`` (target pieces × source ids)."""
    a = np.asarray(weights, np.float32)[:, None, None, :].repeat(2, axis=1).repeat(2, axis=2)  # (T, L, h, S)
    n_source = 1 + max(w for ws in sources for w in ws)
    n_target = 1 + max(w for ws in targets for w in ws)
    return Alignable(
        [(2 * k, 2 * k + 1) for k in range(n_source)], [(2 * k, 2 * k + 1) for k in range(n_target)],
        [_Segment(sources, targets, a)], 2, 2,
    )  # fmt: skip


def test_methods_link_words_by_their_pieces_weights() -> None:
    # source ids: word 0 in two pieces, word 1, </s>; target pieces: word 0, word 1, word 2, </s>
    a = one_segment(
        [[0.3, 0.3, 0.4, 0.0], [0.1, 0.1, 0.7, 0.1], [0.2, 0.2, 0.5, 0.1], [0.0, 0.0, 0.1, 0.9]],
        [[0], [0], [1], []],
        [[0], [1], [2], []],
    )
    assert a.links(BASELINE) == [((2, 3), (0, 1)), ((2, 3), (2, 3)), ((2, 3), (4, 5))]  # piece argmax: all to word 1
    words = replace(DEFAULT, method="words")
    assert a.links(words) == [((0, 1), (0, 1)), ((2, 3), (2, 3)), ((2, 3), (4, 5))]  # word 0's two pieces add up
    agreed = replace(DEFAULT, method="agreed")
    assert a.links(agreed) == [((0, 1), (0, 1)), ((2, 3), (2, 3))]  # word 1 gives target word 1 the most
    shifted = replace(DEFAULT, method="words", shift=True)
    assert a.links(shifted)[0] == ((2, 3), (0, 1))  # piece 0's row is the step after it


def test_a_layer_or_head_the_model_lacks_is_refused() -> None:
    a = one_segment([[1.0, 0.0]], [[0], []], [[0]])
    assert a.links(replace(DEFAULT, layer=-2, heads=(1,))) == [((0, 1), (0, 1))]
    with pytest.raises(NoSuchIndex, match="alignment_layer 2"):
        a.links(replace(DEFAULT, layer=2))
    with pytest.raises(NoSuchIndex, match=r"alignment_heads \[2\]"):
        a.links(replace(DEFAULT, heads=(0, 2)))


def test_offsets_follow_the_texts_through_stand_ins_and_multibyte_pieces() -> None:
    assert _char_map("Open {0} now", "Open %s now")[5:8] == [(5, 7)] * 3  # a stand-in lands on its whole span
    assert _char_map("ab", "b") == [(0, 0), (0, 1)]  # a dropped character maps to nothing
    assert _piece_spans("aＡb", [(0, 1), (1, 1), (1, 1), (1, 4), (4, 5)]) == [(0, 1), (1, 2), (1, 2), (1, 2), (2, 3)]


@pytest.mark.parametrize(
    ("text", "source", "target"),
    [
        ("Open the file in Firefox.", "Firefox", "Firefox"),
        ("Could not open %s: permission denied", "%s", "%s"),
        ("Save it to https://example.com now.\nThen quit GIMP.", "https://example.com", "https://example.com"),
        ("Then quit GIMP.\nSave it to https://example.com now.", "GIMP", "GIMP"),
    ],
)
def test_copied_words_and_spans_align_on_the_shipped_model(
    shipped: Engine, text: str, source: str, target: str
) -> None:
    (t,) = shipped.translate_now([text], Options(alignments=True))
    assert t.alignable is not None and target in t.text
    links = t.alignable.links(DEFAULT)
    assert links and all(0 <= a < b <= len(text) and 0 <= c < d <= len(t.text) for (a, b), (c, d) in links)
    assert all(not text[a:b].isspace() and not t.text[c:d].isspace() for (a, b), (c, d) in links)
    s, g = text.index(source), t.text.index(target)
    assert any(a < s + len(source) and s < b and c < g + len(target) and g < d for (a, b), (c, d) in links)


def test_alignments_are_the_same_with_details_and_in_a_list(shipped: Engine) -> None:
    texts = ["Open the file in Firefox.", "Could not open %s: permission denied"]
    alone = [shipped.translate_now([t], Options(alignments=True))[0] for t in texts]
    together = shipped.translate_now(texts, Options(alignments=True, details=True))
    for a, b in zip(alone, together, strict=True):
        assert a.text == b.text
        assert a.alignable is not None and b.alignable is not None
        assert a.alignable.links(DEFAULT) == b.alignable.links(DEFAULT)


def test_a_forced_translation_aligns_its_own_words(shipped: Engine) -> None:
    text, forced = "Open %s in GIMP.\nSave it.", "GIMP で %s を開く。\n保存する。"
    (result,) = shipped.attention_now([text], Options(alignments=True), Filters(kinds=["cross"]), [forced])
    assert result.text == forced and result.alignable is not None
    spans = result.alignable.links(DEFAULT)
    assert ("%s", "%s") in {(text[a:b], forced[c:d]) for (a, b), (c, d) in spans}
    second = (text.index("\n"), forced.index("\n"))  # the second line's words map to the second lines
    assert any(a > second[0] and c > second[1] for (a, _), (c, _) in spans)
    assert all((a > second[0]) == (c > second[1]) for (a, _), (c, _) in spans)


def test_a_glossary_term_aligns_to_its_target_term(shipped: Engine) -> None:
    text = "Empty the Trash before you quit."
    (t,) = shipped.translate_now([text], Options(alignments=True, glossary={"Trash": "ゴミ箱"}))
    assert t.alignable is not None and "ゴミ箱" in t.text
    assert ("Trash", "ゴミ箱") in {(text[a:b], t.text[c:d]) for (a, b), (c, d) in t.alignable.links(DEFAULT)}
