"""service/decoding/search.py and its C kernels (service/runtime/_beam.c): log-probabilities without the (N, V) array,
exact
beam candidates, beam places, and the cache row copies."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding import beam_places, beam_top
from service.decoding.search import CandidateScores, Scores
from service.runtime import _beam
from service.runtime.runner import Candidates


def brute_force(logits: np.ndarray, rows: list[int], scores: np.ndarray, n: int) -> list[tuple[int, int]]:
    """One request's n best (row, token) continuations, from every log-probability written out."""
    logp = logits - (logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)))[:, None]
    ranked = sorted(
        ((scores[j] + logp[r, v], r, v) for j, r in enumerate(rows) for v in range(logits.shape[1])),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    return [(r, v) for value, r, v in ranked[:n] if np.isfinite(value)]


@pytest.mark.parametrize("spread", [0.1, 3.0, 30.0])  # flat to peaked
@pytest.mark.parametrize("V", [256, 203, 53, 8])  # whole blocks of 64, a tail block, fewer tokens than a block
def test_beam_candidates_are_the_exact_best(spread: float, V: int) -> None:
    rng = np.random.default_rng(int(spread * 10) + V)
    logits = (rng.standard_normal((9, V)) * spread).astype(np.float32)
    logits[:, 7] = -np.inf  # padding
    logits[4, 2] = logits[4, 3] = logits[4].max() + 1  # a tie, broken by token
    logits[8] = logits[0]  # rows 8 and 0 of request 1, with equal scores: ties across rows, broken by row
    s = Scores(logits.copy(), np.ones(len(logits), bool))
    rows = np.array([[1, 2, 4], [8, 0, 6], [3, 5, 7]])  # three requests of three rows, not in batch order
    scores = np.array([[-0.5, -2.0, -np.inf], [-1.0, -1.0, -3.0], [-np.inf, -0.1, -np.inf]])  # -inf: not alive
    n = 6
    j, r, v, value = beam_top(s, rows, scores, n)
    assert np.all(np.diff(j) >= 0), "request by request"
    for q in range(len(rows)):
        want = brute_force(logits, sorted(rows[q]), scores[q][np.argsort(rows[q])], n)
        assert list(zip(r[j == q].tolist(), v[j == q].tolist(), strict=True)) == want
    assert not np.isin(v, 7).any() and np.isfinite(value).all()
    assert s.logp(np.array([2]), np.array([3]))[0] == pytest.approx(
        float(logits[2, 3] - np.log(np.exp(logits[2].astype(np.float64)).sum())), abs=1e-5
    )


def test_log_normalizers_and_block_maxima() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((6, 8000)) * np.array([[0.01], [1], [10], [100], [1], [1]])).astype(np.float32)
    logits[:, 7999] = -np.inf  # padding
    logits[4, :4000] = -np.inf
    s = Scores(logits.copy(), np.array([True, True, True, True, True, False]))
    x = logits[:5].astype(np.float64)
    want = x.max(1) + np.log(np.exp(x - x.max(1, keepdims=True)).sum(1))
    np.testing.assert_allclose(s.log_norm[:5], want, rtol=2e-7, atol=2e-6)
    padded = np.pad(logits, ((0, 0), (0, 64 * 125 - 8000)), constant_values=-np.inf)
    np.testing.assert_array_equal(s.block_max[:5], padded[:5].reshape(5, 125, 64).max(2))
    assert np.isnan(s.log_norm[5]) and np.isnan(s.block_max[5]).all()


def test_the_c_step_refuses_arrays_it_cannot_read() -> None:
    logits = np.zeros((2, 70), np.float32)
    log_norm, block_max = np.zeros(2, np.float32), np.zeros((2, 2), np.float32)
    for bad in (
        (logits.astype(np.float64), np.arange(2), log_norm, block_max),  # wrong dtype
        (logits, np.array([0, 2]), log_norm, block_max),  # a row out of range
        (logits, np.arange(2), log_norm, np.zeros((2, 1), np.float32)),  # too few blocks
        (np.zeros((2, 140), np.float32)[:, ::2], np.arange(2), log_norm, block_max),  # not contiguous
    ):
        with pytest.raises((ValueError, BufferError)):
            _beam.scores(*bad)
    out = [np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4)]
    with pytest.raises(ValueError):  # room for fewer than J n candidates
        _beam.top(logits, log_norm, block_max, np.array([[0, 1]]), np.zeros((1, 2)), 8, *out)


def test_rows_are_copied_with_their_own_slot_counts() -> None:
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((6, 2, 5, 3)).astype(np.float32)
    dst, src, used = np.array([4, 0, 5]), np.array([1, 3, 2]), np.array([4, 0, 2])
    want = cache.copy()
    for d, s_, u in zip(dst, src, used, strict=True):
        want[d, :, :u] = want[s_, :, :u]
    _beam.copy_rows(cache, dst, cache, src, used)  # in place
    np.testing.assert_array_equal(cache, want)

    out = np.full((3, 2, 8, 3), 7, np.float32)  # another array, more slots: the rest left as it was
    _beam.copy_rows(out, np.array([2, 0]), cache, np.array([5, 1]), np.array([5, 1]))
    np.testing.assert_array_equal(out[2, :, :5], cache[5])
    np.testing.assert_array_equal(out[0, :, :1], cache[1, :, :1])
    assert (out[2, :, 5:] == 7).all() and (out[0, :, 1:] == 7).all() and (out[1] == 7).all()

    one = np.array([1])
    for bad in (
        (cache, dst, cache, src, np.array([4, 0, 6])),  # more slots than the cache has
        (out, one, cache, one, np.array([6])),  # more slots than the source has
        (cache, np.array([6]), cache, np.array([0]), one),  # a row out of range
        (cache, dst, cache, src[:2], used),  # unpaired rows
        (cache, dst, cache, src, used[:2]),  # unpaired counts
        (cache[0], dst, cache[0], src, used),  # not 4-d
        (np.zeros((6, 3, 5, 3), np.float32), dst, cache, src, used),  # other heads
        (cache.astype(np.float64), dst, cache, src, used),  # other type
        (cache[:, :, ::2], dst, cache, src, used),  # not contiguous
    ):
        with pytest.raises((ValueError, BufferError)):
            _beam.copy_rows(*bad)


def test_spans_are_copied_and_the_rest_zeroed() -> None:
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((3, 2, 9, 4)).astype(np.float32)  # packed encoder rows
    out = np.full((5, 2, 6, 4), np.nan, np.float32)
    dst, src, start, used = np.array([4, 0, 2]), np.array([1, 1, 0]), np.array([0, 5, 3]), np.array([5, 4, 6])
    _beam.copy_spans(out, dst, cache, src, start, used)
    for d, s_, f, u in zip(dst, src, start, used, strict=True):
        np.testing.assert_array_equal(out[d, :, :u], cache[s_, :, f : f + u])
        assert (out[d, :, u:] == 0).all()
    assert np.isnan(out[[1, 3]]).all()  # other rows untouched
    one = np.array([0])
    for bad in (
        (out, one, cache, one, np.array([4]), np.array([6])),  # past the source row's end
        (out, one, cache, one, one, np.array([7])),  # more slots than out has
        (out, np.array([5]), cache, one, one, one),  # a row out of range
        (out, dst, cache, src, start[:2], used),  # unpaired
        (out, dst, cache.astype(np.float64), src, start, used),  # other type
    ):
        with pytest.raises((ValueError, BufferError)):
            _beam.copy_spans(*bad)


def test_no_live_row_gives_no_candidates() -> None:
    s = Scores(np.zeros((2, 5), np.float32), np.ones(2, bool))
    j, r, v, value = beam_top(s, np.array([[0, 1]]), np.array([[-np.inf, -np.inf]]), 4)
    assert len(j) == len(r) == len(v) == len(value) == 0


def test_beam_children_stay_in_their_parents_rows() -> None:
    rows = np.array([[4, 0, 7], [1, 6, 2], [3, 5, 8]])  # three requests of three rows, not in batch order
    j = np.array([0, 0, 0, 1, 1, 2])  # request 1 has two children, request 2 one
    parent = np.array([7, 7, 4, 6, 6, 5])  # best first
    place = beam_places(rows, j, parent)
    assert len(set(place.tolist())) == len(place), "one child a row"
    assert all(p in rows[q] for q, p in zip(j.tolist(), place.tolist(), strict=True)), "in its request's rows"
    assert place[[0, 2, 3, 5]].tolist() == [7, 4, 6, 5], "a parent's first child stays: no cache copied"
    assert place[1] == 0 and place[4] in (1, 2)  # the others take rows whose hypotheses got no child


def test_only_scored_rows_get_log_probabilities() -> None:
    logits = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    scored = np.array([True, False, True, False])
    s = Scores(logits.copy(), scored)
    want = np.log(np.exp(logits.astype(np.float64)).sum(1))
    np.testing.assert_allclose(s.log_norm[scored], want[scored], atol=1e-5)
    assert np.isnan(s.log_norm[~scored]).all()
    np.testing.assert_array_equal(Scores(logits.copy(), np.ones(4, bool)).log_norm[scored], s.log_norm[scored])


def test_candidates_rank_as_every_logit_and_score_the_greedy_token() -> None:
    """Each row's 2k best tokens (ties: the lower token first) rank a request's continuations as every logit does,
    ties across rows included; the greedy token's log-probability is the row's largest even where a device's
    ordering of equal logits put another token first."""
    rng = np.random.default_rng(3)
    logits = rng.integers(-4, 4, size=(6, 90)).astype(np.float32)  # many equal logits in every row
    logits[:, 7] = -np.inf  # padding
    logits[3] = logits[1]  # equal rows: ties across rows
    every = Scores(logits.copy(), np.ones(6, bool))
    rows, hyp = np.array([[0, 1, 3], [2, 5, 4]]), np.array([[0.0, -0.5, -0.5], [-1.0, -np.inf, -2.0]])
    tokens = np.lexsort((np.broadcast_to(np.arange(90), logits.shape), -logits), axis=1)[:, :6]
    greedy = logits.argmax(axis=1)
    few = CandidateScores(Candidates(tokens, np.take_along_axis(logits, tokens, 1), every.log_norm), greedy)
    for a, b in zip(beam_top(every, rows, hyp, 6), beam_top(few, rows, hyp, 6), strict=True):
        np.testing.assert_array_equal(a, b)
    swapped = tokens[:, :1].copy()
    swapped[0, 0] = np.flatnonzero(logits[0] == logits[0].max())[-1]  # the last of the row's equal best
    first = CandidateScores(Candidates(swapped, logits.max(1, keepdims=True), every.log_norm), greedy)
    np.testing.assert_array_equal(first.logp(np.arange(6), greedy), every.logp(np.arange(6), greedy))
