"""Spans restored, checked and recovered: a model that mangles its stand-ins still gives whole texts, each through
the path the test forces, and the path is in ``return_details`` and the metric."""

from __future__ import annotations

import asyncio
from unittest.mock import patch

import numpy as np
import pytest

from service.decoding import DecodeRequest, DecodeResult, Hypothesis
from service.metrics import Metrics
from service.serving.engine import Engine
from service.serving.restoring import PATHS, recovered, restore_spans, worst
from service.serving.translation import Options, Translation
from service.settings import EN_JA, Settings
from service.text.verify import problems
from tests.service.mangler import EOS, MANGLED, mangler_engine


def whole(source: str, text: str, spans: list[str]) -> None:
    assert "{" not in text and "}" not in text, text
    for s in spans:
        assert text.count(s) == source.count(s), (s, text)


def test_mangled_stand_ins_are_decoded_again_constrained() -> None:
    engine = mangler_engine()
    (t,) = engine.translate_now(["C %s C"], Options(details=True))
    assert t.text == "A %s"  # "A {0}": the constrained search finished the stand-in the model broke, and stopped
    assert t.details is not None and t.details.spans == "constrained"
    assert t.details.tokens == ["▁A", "▁{", "0", "}", "</s>"]  # details are the constrained decode's


def test_when_the_constrained_decode_fails_too_spans_are_placed_by_attention_in_the_cleaned_text() -> None:
    engine = mangler_engine()
    (t,) = engine.translate_now(["C %s C"], Options(details=True, max_length=3))  # too short for "{0}" and </s>
    assert t.details is not None and t.details.spans == "attention"
    assert t.text == "%s A lg"  # "A {lg": the brace gone, the span where the attention is
    whole("C %s C", t.text, ["%s"])


class Forcing:
    """A forced decoder that counts its calls; its second step's weights on the source's second token."""

    def __init__(self) -> None:
        self.calls = 0

    def cross_attention(self, sources: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]:
        self.calls += 1
        out = [np.zeros((len(t), 1, 2, len(s)), np.float32) for s, t in zip(sources, targets, strict=True)]
        for weights in out:
            weights[1, ..., 1] = 1.0
        return out


def test_a_text_broken_before_its_spans_are_placed_is_recovered_before_any_attention() -> None:
    engine = mangler_engine()
    prepared = engine.text.prepare(["C %s C"])
    assert prepared is not None
    request = DecodeRequest(src=[11, 2, 11, EOS])
    forcing = Forcing()
    steps = restore_spans(engine.text, forcing, prepared, [request], [DecodeResult([Hypothesis(MANGLED, [])], None)])
    again = next(steps)  # "A {lg} B 7" is broken wherever "%s" goes: the constrained decode comes first
    assert isinstance(again, list) and again[0].constraint is not None and forcing.calls == 0
    with pytest.raises(StopIteration) as stop:
        steps.send([DecodeResult([Hypothesis([6, 2, EOS], [])], None)])  # "A {0}": copied, nothing to place
    assert stop.value.value.texts == [["A %s"]] and stop.value.value.paths == ["constrained"]
    assert forcing.calls == 0

    plain = DecodeResult([Hypothesis([6, 7, EOS], [])], None)
    steps = restore_spans(engine.text, forcing, prepared, [request], [plain])
    attach = next(steps)  # "A B": whole with the span anywhere, so attention places it (not at the end)
    assert callable(attach)
    attach()
    with pytest.raises(StopIteration) as stop:
        next(steps)
    assert forcing.calls == 1 and stop.value.value.texts == [["A %s B"]] and stop.value.value.paths == ["decoded"]


def test_a_constrained_first_decode_answers_where_whole_and_else_recovers_from_an_unconstrained_one() -> None:
    engine = mangler_engine()
    prepared = engine.text.prepare(["C %s C"])
    assert prepared is not None
    (segment,) = prepared.segments
    constrained = DecodeRequest(src=[11, 2, 11, EOS], constraint=engine.text.constraint(segment))
    forcing = Forcing()
    requests, results = [constrained], [DecodeResult([Hypothesis([6, 2, EOS], [])], None)]  # "A {0}"
    with pytest.raises(StopIteration) as stop:
        next(restore_spans(engine.text, forcing, prepared, requests, results))
    assert stop.value.value.texts == [["A %s"]] and stop.value.value.paths == ["constrained"]

    requests, results = [constrained], [DecodeResult([Hypothesis([6, 3, 8, EOS], [])], None)]  # "A {lg": broken
    steps = restore_spans(engine.text, forcing, prepared, requests, results)
    plain = next(steps)
    assert isinstance(plain, list) and plain[0].constraint is None and plain[0].src == constrained.src
    attach = steps.send([DecodeResult([Hypothesis(MANGLED, [])], None)])  # broken too: no constrained decode again
    assert callable(attach)
    attach()
    with pytest.raises(StopIteration) as stop:
        next(steps)
    assert stop.value.value.paths == ["attention"] and requests[0] is plain[0] and forcing.calls == 1
    whole("C %s C", stop.value.value.texts[0][0], ["%s"])


def test_the_last_resort_appends_every_span() -> None:
    engine = mangler_engine()
    prepared = engine.text.prepare(["C %s C"])
    assert prepared is not None
    (segment,) = prepared.segments
    hyp = Hypothesis(MANGLED, [])
    assert engine.text.appended(segment, hyp) == "A B %s"  # the broken stand-in and the made-up 7 gone
    with patch.object(engine.text, "restored", lambda *a, **k: "A {lg} B %s"):
        texts, path = recovered(engine.text, segment, [11, 2, 11, EOS], [hyp])
    assert (texts, path) == (["A B %s"], "appended")


def test_paths_are_counted_and_a_text_reports_its_latest() -> None:
    engine = mangler_engine()
    seen: list[list[str]] = []

    async def served() -> list[Translation]:
        await engine.start(on_spans=seen.append)
        try:
            return await engine.translate(["C %s C", "C C", "C 7 C", "C %s\nC {x} C"], Options())
        finally:
            await engine.stop()

    out = asyncio.run(served())
    assert [t.text for t in out][::2] == ["A %s", "A 7"]  # the number, a span, kept; no other made up
    assert out[3].text == "A %s\nA {x}"
    assert seen == [["constrained"] * 4]  # one per sentence with spans; "C C" has none
    metrics = Metrics()
    for paths in seen:
        metrics.observe_spans(paths)
    text = metrics.render().decode()
    assert 'attnserve_span_segments_total{path="constrained"} 4.0' in text
    assert 'attnserve_span_segments_total{path="appended"} 0.0' in text
    assert worst(["decoded", None, "attention", "constrained"]) == "attention" and worst([None]) is None
    assert PATHS == ("decoded", "constrained", "attention", "appended")


MULTI_TAG = "<b>zoom</b>: scroll, <b>pan</b>: shift+drag, <b>rotate</b>: ctrl+drag, <b>reset</b>: double-click (%d%%)"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_multi_tag_line_comes_back_whole_from_the_shipped_model(beam_size: int) -> None:
    engine = Engine.load(EN_JA, Settings(threads=1))
    (t,) = engine.translate_now([MULTI_TAG], Options(details=True, beam_size=beam_size))
    prepared = engine.text.prepare([MULTI_TAG])
    assert prepared is not None and prepared.segments[0].masked is not None
    assert problems(prepared.segments[0].masked, t.text) == [], t.text
    whole(MULTI_TAG, t.text, ["<b>", "</b>", "%d%%"])
    assert [m for m in t.text.split("<b>")[1:] if "</b>" not in m] == []  # each <b> closed before the next
    assert t.details is not None and t.details.spans in PATHS


def test_numbers_of_a_source_come_back_none_lost_none_added() -> None:
    engine = Engine.load(EN_JA, Settings(threads=1))
    source = "Receives 60% defense on sand and 30% in water"
    (t,) = engine.translate_now([source], Options())
    digits = "".join(c if c.isdigit() else " " for c in t.text).split()
    assert sorted(digits) == ["30", "60"], t.text
