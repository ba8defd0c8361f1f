"""Beam search's per-step arithmetic, in C (service/runtime/_beam.c)."""

import numpy as np

BLOCK: int  # tokens a block of block_max

def scores(logits: np.ndarray, rows: np.ndarray, log_norm: np.ndarray, block_max: np.ndarray) -> None:
    """Rows ``rows`` of float32 ``logits`` (N, V): their log-normalizers into ``log_norm`` (N,) and block maxima
    into ``block_max`` (N, ceil(V / BLOCK)), both float32."""

def top(
    logits: np.ndarray,
    log_norm: np.ndarray,
    block_max: np.ndarray,
    rows: np.ndarray,
    hyp: np.ndarray,
    n: int,
    out_j: np.ndarray,
    out_r: np.ndarray,
    out_t: np.ndarray,
    out_v: np.ndarray,
) -> int:
    """The n best continuations of each request (rows int64 (J, k), hyp float64 (J, k)) into out_j, out_r, out_t
    (int64) and out_v (float64), request by request, best first; returns how many."""

def copy_rows(out: np.ndarray, dst: np.ndarray, cache: np.ndarray, src: np.ndarray, used: np.ndarray) -> None:
    """``out[dst[i], :, :used[i]] = cache[src[i], :, :used[i]]`` for C-contiguous (N, h, C, d) arrays of one h, d and
    dtype (C may differ; ``out`` may be ``cache``: then dst and src disjoint); dst, src, used int64 (m,)."""

def copy_spans(
    out: np.ndarray, dst: np.ndarray, cache: np.ndarray, src: np.ndarray, start: np.ndarray, used: np.ndarray
) -> None:
    """``out[dst[i], :, :used[i]] = cache[src[i], :, start[i]:start[i] + used[i]]`` and ``out[dst[i], :, used[i]:]``
    zero, for C-contiguous (N, h, C, d) arrays of one h, d and dtype; dst, src, start, used int64 (m,)."""
