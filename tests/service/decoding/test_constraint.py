"""Constrained search: each stand-in exactly once, no other brace or made-up digit, </s> only after them all; and a
constrained row decodes the same alone as in any batch, greedy or beam."""

from __future__ import annotations

import re
from collections.abc import Hashable

import numpy as np
import pytest

from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, decode
from service.decoding.constraint import KEPT, OUTSIDE, Spelling, StandIns
from tests.service.decoding.test_decoder import EOS, PAD, PrefixModel, V

# V = 12 pieces for PrefixModel's vocabulary: a stand-in spelled whole, in pieces, or with a byte piece.
PIECES = ["</s>", "<unk>", "▁a", "▁{", "0", "1", "}", "{0}", "<0x7B>", "b", "2}", "<pad>"]
assert len(PIECES) == V and PIECES[EOS] == "</s>" and PIECES[PAD] == "<pad>"
SPELLING = Spelling(PIECES, EOS)


def spelled(tokens: list[int]) -> str:
    text = "".join(PIECES[t] for t in tokens if t != EOS).replace("▁", " ")
    return text.replace("<0x7B>", "{")


def run(constraint: StandIns, tokens: list[int]) -> tuple[int, int] | None:
    state: tuple[int, int] | None = (OUTSIDE, 0)
    for t in tokens:
        assert state is not None
        state = constraint.advance(*state, t)
    return state


def test_each_stand_in_once_in_any_spelling_and_nothing_else_with_braces() -> None:
    two = StandIns(SPELLING, 2, digits=False)
    assert run(two, [7, 2, 3, 5, 6]) == (OUTSIDE, 0b11)  # "{0} a {1}"
    assert run(two, [8, 5, 6, 9, 3, 4, 6]) == (OUTSIDE, 0b11)  # a byte piece's "{"
    assert run(two, [7, 7]) is None  # {0} twice
    assert run(two, [6]) is None  # a lone "}"
    assert run(two, [3, 10]) is None  # {2}: the source has no third stand-in
    assert run(two, [3, 2]) is None  # "{ a": a broken stand-in
    assert run(two, [4]) is None  # a digit of its own: a made-up number
    assert run(StandIns(SPELLING, 2, digits=True), [4, 7]) == (OUTSIDE, 0b01)
    assert run(StandIns(SPELLING, 3, digits=False), [3, 10]) == (OUTSIDE, 0b100)  # "{" then "2}"

    start = two.allowed(OUTSIDE, 0).mask()
    assert not start[EOS] and start[2] and start[7] and start[3] and not start[6] and not start[4]
    assert two.allowed(OUTSIDE, 0b11).mask()[EOS] and not two.allowed(OUTSIDE, 0b11).mask()[7]
    inside = two.allowed(0, 0b01).mask()  # after "{" with {0} out: only "1" goes on
    assert np.flatnonzero(inside).tolist() == [5]
    with pytest.raises(ValueError, match="62"):
        StandIns(SPELLING, 63, digits=False)


def test_a_states_tokens_are_kept_once_for_every_request_of_the_pair_and_forbid_what_the_mask_forbids() -> None:
    spelling = Spelling(PIECES, EOS)
    first, second = StandIns(spelling, 2, digits=False), StandIns(spelling, 2, digits=False)
    assert first.allowed(OUTSIDE, 0) is second.allowed(OUTSIDE, 0)  # another request of the pair: no rebuild
    assert first.allowed(OUTSIDE, 0) is not StandIns(spelling, 2, digits=True).allowed(OUTSIDE, 0)
    rng = np.random.default_rng(0)
    for state, done in [(OUTSIDE, 0), (OUTSIDE, 0b11), (0, 0b01), (0, 0b00)]:
        allowed = first.allowed(state, done)
        logits = rng.standard_normal(V).astype(np.float32)
        expected = np.where(allowed.mask(), logits, -np.inf)
        allowed.apply(logits)
        assert np.array_equal(logits, expected)
    assert {first.allowed(0, 0b01).keep, first.allowed(OUTSIDE, 0).keep} == {True, False}  # both forms
    for count in range(2, 63):  # more states than a spelling keeps: the oldest go
        for digits in (False, True):
            for done in range(4):
                StandIns(spelling, count, digits).allowed(OUTSIDE, done)
    assert len(spelling.kept) == KEPT


def requests() -> list[DecodeRequest]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(24):
        k, count = int(rng.choice([1, 1, 2, 3])), int(rng.integers(0, 3))
        constraint = StandIns(SPELLING, count, digits=bool(i % 5 == 0)) if i % 3 else None
        out.append(DecodeRequest(src=[int(rng.integers(2, 10)), EOS], beam_size=k, n_best=k, max_length=14,
                                 constraint=constraint))  # fmt: skip
    return out


def test_constrained_rows_decode_alike_alone_and_in_any_batch_and_keep_the_constraint() -> None:
    reqs = requests()
    alone = [decode(PrefixModel(), [r])[0] for r in reqs]
    decoder = BatchDecoder(PrefixModel(), age=2)
    decoder.admit(list(enumerate(reqs[:5])))
    pending = list(enumerate(reqs))[5:]
    results: dict[Hashable, DecodeResult] = {}
    while decoder.num_rows:
        done, _ = decoder.step()
        results.update(done)
        for _ in done[:2]:
            if pending:
                decoder.admit([pending.pop(0)])
    kept = 0
    for i, r in enumerate(reqs):
        got, want = results[i].hypotheses, alone[i].hypotheses
        assert [h.tokens for h in got] == [h.tokens for h in want], f"request {i}"
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5, nan_ok=True)
        if r.constraint is None:
            continue
        for h in got:
            if h.tokens[-1] == EOS and np.isfinite(h.score):  # finished: every stand-in, once
                text = spelled(h.tokens)
                assert sorted(re.findall(r"\{(\d+)\}", text)) == [str(n) for n in range(r.constraint.count)], text
                assert text.count("{") == text.count("}") == r.constraint.count
                kept += 1
    assert kept > 5
