"""A batch's rows as arrays (:class:`Rows`), the requests they decode (:class:`Job`), and what a step does with
them (:class:`Plan`): a step's bookkeeping is a few numpy calls for the whole batch, not Python per row."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from service.decoding.constraint import OUTSIDE
from service.decoding.request import DecodeRequest, Hypothesis


@dataclass
class Job:
    """A request in a batch, and the hypotheses it has finished."""

    key: Hashable
    request: DecodeRequest
    encoder_attention: np.ndarray | None
    finished: list[Hypothesis] = field(default_factory=list)


Attention = tuple[list[np.ndarray], list[np.ndarray]]  # one row's self- and cross-attention rows, per step


class Rows:
    """The batch's rows as arrays, entry r for cache row r. A hole (a row whose request left) has job -1."""

    ARRAYS = (
        "job", "width", "limit", "prefix", "start", "alive", "scored", "length", "last", "score", "tokens",
        "token_scores", "constrained", "state", "done",
    )  # fmt: skip

    def __init__(self, n: int = 0, columns: int = 16) -> None:
        self.job = np.full(n, -1, np.int64)  # request number (BatchDecoder.jobs); -1: a hole
        self.width = np.ones(n, np.int64)  # 0: forced decoding, 1: greedy, k ≥ 2: one of k beam rows
        self.limit = np.ones(n, np.int64)  # tokens at most
        self.prefix = np.zeros(n, np.int64)  # its request's forced target prefix' length (DecodeRequest.prefix)
        self.start = np.zeros(n, np.int64)  # first cache slot this row owns
        self.alive = np.zeros(n, bool)  # False: a beam row before its first hypothesis (or a hole)
        self.scored = np.zeros(n, bool)  # its log-probabilities are needed (beam search, or the request asked)
        self.length = np.zeros(n, np.int64)  # tokens generated (0 for a hole: its position id)
        self.last = np.zeros(n, np.int64)  # the last token generated (decoder_start_id before the first)
        self.score = np.zeros(n)  # their summed log-probabilities (float64, summed in order like Hypothesis.score)
        self.tokens = np.zeros((n, columns), np.int64)  # [:, :length]
        self.token_scores = np.zeros((n, columns))
        self.attention: list[Attention | None] = [None] * n  # only for requests that collect attention
        self.constrained = np.zeros(n, bool)  # its request adjusts logits (DecodeRequest.adjusted)
        self.state = np.full(n, OUTSIDE, np.int64)  # the constraint's state: OUTSIDE or the stand-in digits read
        self.done = np.zeros(n, np.int64)  # the constraint's stand-ins emitted, a bit each

    def __len__(self) -> int:
        return len(self.job)

    def take(self, ix: np.ndarray) -> Rows:
        """Rows ``ix`` (a row may repeat: beams); attention lists are shared until a step appends to them."""
        rows = Rows.__new__(Rows)
        for name in self.ARRAYS:
            setattr(rows, name, getattr(self, name)[ix])
        rows.attention = [self.attention[i] for i in ix.tolist()]
        return rows

    def head(self, n: int) -> Rows:
        """The first n rows, as views (no copy)."""
        rows = Rows.__new__(Rows)
        for name in self.ARRAYS:
            setattr(rows, name, getattr(self, name)[:n])
        rows.attention = self.attention[:n]
        return rows

    def move(self, dst: np.ndarray, src: np.ndarray) -> None:
        """Rows ``dst`` become copies of rows ``src`` (in place; attention lists shared as in :meth:`take`)."""
        for name in self.ARRAYS:
            array = getattr(self, name)
            array[dst] = array[src]
        for d, s in zip(dst.tolist(), [self.attention[i] for i in src.tolist()], strict=True):
            self.attention[d] = s

    def extend(self, n: int) -> None:
        """Add n holes."""
        self.join(Rows(n, self.tokens.shape[1]))

    def join(self, other: Rows) -> None:
        """Append ``other``'s rows."""
        self.reserve(other.tokens.shape[1])
        other.reserve(self.tokens.shape[1])
        for name in self.ARRAYS:
            setattr(self, name, np.concatenate([getattr(self, name), getattr(other, name)]))
        self.attention += other.attention

    def reserve(self, columns: int) -> None:
        """Room for ``columns`` tokens a row."""
        if columns > self.tokens.shape[1]:
            extra = max(columns, 2 * self.tokens.shape[1]) - self.tokens.shape[1]
            self.tokens = np.pad(self.tokens, ((0, 0), (0, extra)))
            self.token_scores = np.pad(self.token_scores, ((0, 0), (0, extra)))

    def prefixed(self) -> np.ndarray:
        """The live rows whose next token is their request's prefix'."""
        live: np.ndarray = np.flatnonzero((self.job >= 0) & (self.length < self.prefix))
        return live

    def hypothesis(self, r: int) -> Hypothesis:
        n = int(self.length[r])
        scores = self.token_scores[r, :n].tolist() if self.scored[r] else [math.nan] * n  # unscored: never written
        hyp = Hypothesis(self.tokens[r, :n].tolist(), scores)
        if (attention := self.attention[r]) is not None:
            hyp.self_attention, hyp.cross_attention = list(attention[0]), list(attention[1])
        return hyp


@dataclass(frozen=True)
class Plan:
    """What a step does with a batch's rows; the same every step until rows join or leave."""

    one: np.ndarray  # greedy and forced rows
    forced: list[int]  # forced rows
    widths: list[int]  # beam sizes of the batch's beam rows
    scored: bool  # some row needs log-probabilities
    attends: bool  # some row collects attention
    constrained: np.ndarray  # rows whose request adjusts logits (a constraint, a repetition penalty)
    tokens: np.ndarray  # rows a graph's own greedy tokens may serve: all but those whose logits the step reads
    argmax: np.ndarray  # greedy and forced rows whose logits the step reads: their token is the logits' argmax

    @classmethod
    def of(cls, rows: Rows) -> Plan:
        live = rows.job >= 0
        beam = live & (rows.width >= 2)
        one = np.flatnonzero(live ^ beam)
        forced = one[rows.width[one] == 0].tolist()
        widths = np.unique(rows.width[beam]).tolist() if beam.any() else []
        scored = bool((live & rows.scored).any())
        attends = any(a is not None for a in rows.attention)  # a hole's is None
        constrained = np.flatnonzero(live & rows.constrained)
        read = live & (beam | (rows.width == 0) | rows.scored | rows.constrained)  # rows whose logits are read
        return cls(
            one, forced, widths, scored, attends, constrained, np.flatnonzero(~read), np.flatnonzero(read & ~beam)
        )
