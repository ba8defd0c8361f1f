"""The step scores of service/decoding.py: log-probabilities without the (N, V) array, and exact beam candidates."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding import _Scores, beam_top


def brute_force(logits: np.ndarray, rows: list[int], scores: np.ndarray, n: int) -> list[tuple[int, int]]:
    """One request's n best (row, token) continuations, from every log-probability written out."""
    logp = logits - (logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)))[:, None]
    ranked = sorted(
        ((scores[j] + logp[r, v], r, v) for j, r in enumerate(rows) for v in range(logits.shape[1])),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    return [(r, v) for value, r, v in ranked[:n] if np.isfinite(value)]


@pytest.mark.parametrize("spread", [0.1, 3.0, 30.0])  # flat to peaked
@pytest.mark.parametrize("V", [50, 53, 8])  # a whole number of blocks, a tail block, fewer tokens than a block
def test_beam_candidates_are_the_exact_best(spread: float, V: int) -> None:
    rng = np.random.default_rng(int(spread * 10) + V)
    logits = (rng.standard_normal((9, V)) * spread).astype(np.float32)
    logits[:, 7] = -np.inf  # padding
    logits[4, 2] = logits[4, 3] = logits[4].max() + 1  # a tie, broken by token
    s = _Scores(logits.copy())
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


def test_no_live_row_gives_no_candidates() -> None:
    s = _Scores(np.zeros((2, 5), np.float32))
    j, r, v, value = beam_top(s, np.array([[0, 1]]), np.array([[-np.inf, -np.inf]]), 4)
    assert len(j) == len(r) == len(v) == len(value) == 0
