"""Repetition penalties on a row's logits, as transformers' ``repetition_penalty`` and ``no_repeat_ngram_size``
(and CTranslate2's options of those names) apply them: the tokens a row has generated are made less likely, and a
token that would repeat an n-gram of them is forbidden."""

from __future__ import annotations

import numpy as np


def penalize(logits: np.ndarray, generated: np.ndarray, penalty: float, ngram: int) -> None:
    """Adjust one row's logits (V,) in place, given its tokens so far.

    Args:
        logits: the row's next-token logits.
        generated: the tokens it has generated, in order.
        penalty: a generated token's logit is divided by this where positive, multiplied where negative (1: none).
        ngram: a token that would complete an n-gram the row already has is forbidden (0: none).
    """
    if penalty != 1.0 and len(generated):
        seen = np.unique(generated)
        values = logits[seen]
        logits[seen] = np.where(values < 0, values * penalty, values / penalty)
    n = len(generated)
    if ngram and n >= ngram:
        if ngram == 1:
            logits[generated] = -np.inf
            return
        windows = np.lib.stride_tricks.sliding_window_view(generated, ngram)  # (n - ngram + 1, ngram)
        last = generated[n - ngram + 1 :]
        logits[windows[(windows[:, :-1] == last).all(axis=1), -1]] = -np.inf
