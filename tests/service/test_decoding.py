"""The step scores of service/decoding.py: log-probabilities without the (N, V) array, and exact beam candidates."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding import _Scores


def brute_force(logits: np.ndarray, idx: list[int], scores: np.ndarray, n: int) -> list[tuple[int, int]]:
    logp = logits - (logits.max(1) + np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)))[:, None]
    ranked = sorted(
        ((scores[j] + logp[i, v], i, v) for j, i in enumerate(idx) for v in range(logits.shape[1])),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    return [(i, v) for value, i, v in ranked[:n] if np.isfinite(value)]


@pytest.mark.parametrize("spread", [0.1, 3.0, 30.0])  # flat (every candidate ranked) to peaked
def test_beam_candidates_are_the_exact_best(spread: float) -> None:
    rng = np.random.default_rng(int(spread * 10))
    logits = (rng.standard_normal((6, 50)) * spread).astype(np.float32)
    logits[:, 7] = -np.inf  # padding
    s = _Scores(logits.copy())
    idx, scores = [1, 2, 4], np.array([-0.5, -2.0, -np.inf])  # the third row is not alive yet
    assert s.beam_top(idx, scores, 8) == brute_force(logits, idx, scores, 8)
    assert all(v != 7 and i != 4 for i, v in s.beam_top(idx, scores, 8))
    assert s.logp(2, 3) == pytest.approx(float(logits[2, 3] - np.log(np.exp(logits[2]).sum())), abs=1e-5)


def test_no_live_row_gives_no_candidates() -> None:
    s = _Scores(np.zeros((2, 5), np.float32))
    assert s.beam_top([0, 1], np.array([-np.inf, -np.inf]), 4) == []
