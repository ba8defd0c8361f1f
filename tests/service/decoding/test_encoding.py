"""service/decoding/encoding.py: the packing of sources into encoder rows."""

from __future__ import annotations

import itertools

import numpy as np

from service.decoding import pack


def test_pack_fills_rows_longest_first_and_packs_only_when_it_saves_tokens() -> None:
    lengths = np.array([3, 30, 5, 2, 28])
    row, start = pack(lengths, (32,))
    # 30 and 28 open rows 0 and 1; 5 fits neither (35, 33 > 32) and opens row 2; 3 goes after 28; 2 after 30.
    assert row.tolist() == [1, 0, 2, 0, 1] and start.tolist() == [28, 0, 0, 30, 0]
    for r in range(3):  # no text overlaps another or the row's end
        spans = sorted((int(start[i]), int(start[i] + lengths[i])) for i in np.flatnonzero(row == r))
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans)) and spans[-1][1] <= 32
    row, start = pack(np.array([7, 8, 8]))  # 23 tokens in one row instead of 3 × 8 padded
    assert row.tolist() == [0, 0, 0] and sorted(start.tolist()) == [0, 8, 16]
    # A row each (20 + 20 > 32; 3 + 40 > 40), or packed no cheaper than padded (2 rows × 20 > 3 × 10): one a row.
    for lengths, width in (([20, 20], 32), ([40, 3], 32), ([10, 10, 10], 20)):
        row, start = pack(np.array(lengths), (width,))
        assert row.tolist() == list(range(len(lengths))) and not start.any()


def encoded_tokens(lengths: np.ndarray, row: np.ndarray, start: np.ndarray) -> int:
    """Rows × the fullest row's tokens: what the encoder computes for a layout."""
    return int(row.max() + 1) * int((start + lengths).max())


def test_pack_takes_the_width_that_encodes_the_fewest_tokens() -> None:
    # 20 + 12 fill a row of 32 and 10 opens another (64 tokens); in one row of 64 they take 42.
    lengths = np.array([20, 12, 10])
    row, start = pack(lengths)
    assert row.tolist() == [0, 0, 0] and encoded_tokens(lengths, row, start) == 42
    # 16 and six of 8: two rows of 32 encode as many tokens as one of 64 (64): the narrower rows.
    lengths = np.array([16, 8, 8, 8, 8, 8, 8])
    row, start = pack(lengths)
    assert row.max() + 1 == 2 and (start + lengths).max() == 32
    rng = np.random.default_rng(0)
    for _ in range(200):  # never more tokens than any one width, or than one text a row
        lengths = rng.integers(1, 60, size=int(rng.integers(1, 33)))
        tokens = encoded_tokens(lengths, *pack(lengths))
        assert tokens <= len(lengths) * lengths.max()
        assert all(tokens <= encoded_tokens(lengths, *pack(lengths, (w,))) for w in (32, 64, 96))
