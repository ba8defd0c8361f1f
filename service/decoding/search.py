"""Search: each row's next token. Greedy (one argmax for every greedy row), forced (the given target's next
token), and beam search, whose rows of every request are ranked together (:func:`beam_top`) on one step's
log-probabilities (:class:`Scores` from every logit, or :class:`CandidateScores` from each row's best tokens) and
placed so that few caches move (:func:`beam_places`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.decoding.rows import Job, Plan, Rows
from service.runtime import _beam
from service.runtime.runner import Candidates


class Scores:
    """One step's log-probabilities, log p(v | row) = logits[row, v] - log_norm[row], without writing the (N, V)
    array of them out: choosing tokens reads the logits, and only the chosen tokens' log-probabilities are formed.
    The log-normalizers and the block maxima that :func:`beam_top` ranks by come from C (service/runtime/_beam.c)."""

    def __init__(self, logits: np.ndarray, scored: np.ndarray) -> None:
        """``scored`` (N,) bool: the rows whose log-normalizer and block maxima are needed (beam rows always;
        greedy rows only when their request asked for scores: the others' log_norm is NaN, and a step whose rows
        need no scores builds no Scores at all)."""
        self.logits = logits  # (N, V) float32, C-contiguous; padding already -inf
        N, V = logits.shape
        self.log_norm = np.full(N, np.nan, np.float32)
        # (N, V / BLOCK): the largest logit of tokens b BLOCK .. (b + 1) BLOCK - 1
        self.block_max = np.full((N, -(-V // _beam.BLOCK)), np.nan, np.float32)
        _beam.scores(logits, np.flatnonzero(scored), self.log_norm, self.block_max)

    def logp(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """log p(tokens | rows), float32 as the logits."""
        logp: np.ndarray = self.logits[rows, tokens] - self.log_norm[rows]
        return logp

    def top(self, rows: np.ndarray, hyp_scores: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
        """:func:`beam_top`, exact in two passes (service/runtime/_beam.c): the n-th best block value (hypothesis
        score + a block's largest log-probability) is a cut that at least n continuations reach, and every
        continuation above it lies in a block above it; only those blocks' tokens are ranked."""
        J = len(rows)
        j, r, t = (np.empty(J * n, np.int64) for _ in range(3))
        value = np.empty(J * n)
        count = _beam.top(
            self.logits, self.log_norm, self.block_max, np.ascontiguousarray(rows, np.int64),
            np.ascontiguousarray(hyp_scores, np.float64), n, j, r, t, value,
        )  # fmt: skip
        return j[:count], r[:count], t[:count], value[:count]


class CandidateScores:
    """One step's log-probabilities from a device decoder's candidates (:class:`~service.runtime.runner.Candidates`):
    each row's K best tokens and their logits, its log-normalizer and its greedy token, log p(v | row) = logit(v) -
    log_norm[row] as :class:`Scores` forms it. Beam search of width k asks for K = 2k: a request's 2k best
    continuations are among its rows' 2k best tokens each (a row's continuations rank by its tokens' logits, ties by
    token in both), so :meth:`top` ranks what :class:`Scores` ranks."""

    def __init__(self, candidates: Candidates, greedy: np.ndarray) -> None:
        self.tokens, self.logits, self.log_norm = candidates.tokens, candidates.logits, candidates.log_norm
        self.greedy = greedy  # (N,) each row's greedy token: its logit is the row's largest, the first candidate's

    def logp(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """log p(tokens | rows), float32 as the logits, of tokens among their rows' candidates or their greedy
        tokens."""
        hit = self.tokens[rows] == tokens[:, None]  # (n, K)
        found = hit.any(axis=1)
        assert (found | (tokens == self.greedy[rows])).all(), "a token neither a candidate nor the greedy one"
        logits = np.where(found, self.logits[rows, hit.argmax(axis=1)], self.logits[rows, 0])
        logp: np.ndarray = logits - self.log_norm[rows]
        return logp

    def top(self, rows: np.ndarray, hyp_scores: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
        """:func:`beam_top` over the rows' candidates: the values _beam.c forms (hypothesis score minus the
        log-normalizer, plus the logit, in float64), ranked by value, then row, then token."""
        J, k = rows.shape
        K = self.tokens.shape[1]
        base = np.asarray(hyp_scores, np.float64) - self.log_norm[rows].astype(np.float64)  # (J, k)
        value = (base[:, :, None] + self.logits[rows].astype(np.float64)).ravel()  # (J k K,)
        j = np.repeat(np.arange(J), k * K)
        r = np.repeat(np.asarray(rows, np.int64).ravel(), K)
        t = self.tokens[rows].ravel()
        order = np.lexsort((t, r, -value, j))
        order = order[np.isfinite(value[order])]  # no row without a hypothesis, no padding
        j_sorted = j[order]
        order = order[np.arange(len(order)) - np.searchsorted(j_sorted, j_sorted) < n]
        return j[order], r[order], t[order], value[order]


def beam_top(
    scores: Scores | CandidateScores, rows: np.ndarray, hyp_scores: np.ndarray, n: int
) -> tuple[np.ndarray, ...]:
    """The n best continuations of each of J requests with k rows each, ranked together.

    Args:
        scores: the step's (every logit, or each row's candidates).
        rows: (J, k) batch rows of each request.
        hyp_scores: (J, k) the rows' hypothesis log-probabilities; -inf for a row not alive yet.
    Returns:
        (request, row, token, value) arrays, request by request, best first (ties by row then token), at most n
        a request and only finite values; value = hypothesis score + log p(token | row).
    """
    return scores.top(rows, hyp_scores, n)


def beam_places(rows: np.ndarray, j: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """The rows that a step's beam children take, so that few caches move: a hypothesis's first child stays in
    its parent's row, and the request's other children take the rows whose hypotheses got no child.

    Args:
        rows: (J, k) batch rows of each request.
        j: each child's request (sorted), at most k a request.
        parent: each child's parent row.
    """
    _, first = np.unique(parent, return_index=True)
    stays = np.zeros(len(parent), bool)
    stays[first] = True
    place = parent.copy()
    continued = np.zeros(int(rows.max()) + 1, bool)
    continued[parent] = True
    free_j, free_c = np.nonzero(~continued[rows])  # rows no child continues, request by request
    moved = j[~stays]
    rank = np.arange(len(moved)) - np.searchsorted(moved, moved)
    place[~stays] = rows[free_j, free_c][np.searchsorted(free_j, moved) + rank]
    return place


def greedy(plan: Plan, logits: np.ndarray, tokens: np.ndarray | None) -> np.ndarray:
    """Each row's greedy next token: the graph's own (``tokens``, when it was asked for them: for the rows of
    ``plan.tokens``), or the argmax of its logits (of the greedy and forced rows only, when beam rows are there too;
    a hole's token is never read)."""
    if tokens is not None:
        if len(plan.argmax):
            tokens[plan.argmax] = logits[plan.argmax].argmax(axis=-1)
        return tokens
    if not plan.widths:
        every: np.ndarray = logits.argmax(axis=-1)
        return every
    token = np.zeros(len(logits), np.int64)
    token[plan.one] = logits[plan.one].argmax(axis=-1)
    return token


def force(token: np.ndarray, plan: Plan, rows: Rows, jobs: dict[int, Job], prefixed: np.ndarray) -> None:
    """Next tokens that are given, into ``token``: a prefix' next id for rows ``prefixed`` (still in their
    request's prefix), then forced rows' targets' next ids."""
    for r in prefixed.tolist():
        token[r] = jobs[int(rows.job[r])].request.prefix[rows.length[r]]
    for r in plan.forced:
        forced = jobs[int(rows.job[r])].request.forced
        assert forced is not None
        if (t := int(rows.length[r] - rows.prefix[r])) >= 0:
            token[r] = forced[t]


@dataclass(frozen=True)
class BeamChoice:
    """One step of beam search for the requests with k rows: the </s> continuations among each request's best k
    finish; the best k others continue, each in a row of its request."""

    rows: np.ndarray  # (J, k) batch rows of each request, in batch order
    ended: np.ndarray  # rows whose hypothesis, plus </s>, finishes
    request: np.ndarray  # each child's request (an index into rows), request by request, best first
    parent: np.ndarray  # each child's parent row
    token: np.ndarray  # each child's token
    place: np.ndarray  # the row each child takes (beam_places)


def beam_choose(rows: Rows, k: int, scores: Scores | CandidateScores, eos: int, token: np.ndarray) -> BeamChoice:
    """Rank the best 2k continuations of the live hypotheses of every request with k rows (:func:`beam_top`).

    A request still in its prefix gets one child, its live row continued by the prefix' next id (``token`` of that
    row). On the step right after a prefix, as CTranslate2 does, only the best continuation may be </s>: a lower one
    is dropped and its place among the k children left empty.
    """
    mine = np.flatnonzero((rows.job >= 0) & (rows.width == k))
    ix = mine[np.lexsort((mine, rows.job[mine]))].reshape(-1, k)  # (J, k): a request's rows in batch order
    hyp_scores = np.where(rows.alive[ix], rows.score[ix], -np.inf)
    j, r, v, _ = beam_top(scores, ix, hyp_scores, 2 * k)
    first = np.searchsorted(j, j)
    rank = np.arange(len(j)) - first
    length, prefix = rows.length[ix].max(axis=1), rows.prefix[ix[:, 0]]  # a row without a child keeps its length
    ends = v == eos
    dropped = ends & (rank >= 1) & ((length == prefix) & (prefix > 0))[j]
    ends &= ~dropped
    going = np.cumsum(~ends) - np.cumsum(~ends)[first] + ~ends[first]  # 1-based place among the request's others
    forcing = length < prefix
    child = ~ends & (going <= k) & ~dropped & ~forcing[j]
    cj, cr, cv = j[child], r[child], v[child]
    if forcing.any():
        q = np.flatnonzero(forcing)
        live = ix[q, rows.alive[ix[q]].argmax(axis=1)]
        order = np.argsort(np.concatenate([cj, q]), kind="stable")
        cj, cr, cv = (np.concatenate(pair)[order] for pair in ((cj, q), (cr, live), (cv, token[live])))
    ended = r[ends & (rank < k) & ~forcing[j]]
    return BeamChoice(ix, ended, cj, cr, cv, beam_places(ix, cj, cr))
