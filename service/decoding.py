"""Batched greedy, beam and forced decoding on the key/value cache, with attention rows collected step by step.

:class:`BatchDecoder` holds the rows (hypotheses) of many requests in two padded batches (:class:`_Batch`): the
young one, where requests join, and the old one, for rows that have decoded many tokens. New requests are admitted
between steps and finished ones leave (iteration-level batching); a row that joins late owns only the cache slots
from its start on — the others are masked out (``self_attention_mask``), so a row's answer does not depend on its
neighbours.

A step's bookkeeping is a few numpy calls for the whole batch, not Python per row: the rows' tokens, scores and
cache starts are arrays (:class:`_Rows`), greedy rows share one argmax, and the beam rows of every request are
ranked together (:func:`beam_top`). Python runs per request only when one finishes, and per row only for requests
that collect attention.

Cache layout, one cache per decoder layer (the runner's kind: numpy, or device values with IOBinding, handled
through ``runner.tensors``): ``past_keys``/``past_values`` (N, h, T, d_k) for N rows, row r owning slots
``start[r]:T``; ``cross_keys``/``cross_values`` (N, h, S, d_k). With a runner whose decoder writes its caches in
place (``runner.in_place``: the fast graph), row r's tokens sit at slots ``0:length[r]`` of buffers (N, h, C, d_k)
instead, there is no ``self_mask`` (T = 0), and the buffers' capacity C follows the longest row.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

import numpy as np

from service import _beam
from service.bundle import ModelSpec
from service.runner import Cache, HostTensors, Runner, StepOutput, Tensors


@dataclass(frozen=True)
class DecodeRequest:
    """One text to decode.

    Args:
        src: source ids ending with </s>.
        beam_size: 1 = greedy.
        max_length: generated tokens at most (</s> included).
        length_penalty: finished beam hypotheses rank by score / length^length_penalty.
        n_best: hypotheses returned (≤ beam_size).
        forced: target ids (ending with </s>) to force-decode instead of searching.
        attention: collect encoder, decoder and cross attention.
        scores: compute each token's log-probability (the log-softmax over the vocabulary, every step). Beam
            search always does, to rank; without it, greedy and forced hypotheses have NaN scores.
    """

    src: list[int]
    beam_size: int = 1
    max_length: int = 64
    length_penalty: float = 1.0
    n_best: int = 1
    forced: list[int] | None = None
    attention: bool = False
    scores: bool = True


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, ending with </s> unless max_length cut it
    token_scores: list[float]  # log-probability of each token (NaN unless the request asked for scores)
    self_attention: list[np.ndarray] = field(default_factory=list)  # per step (L, h, t + 1)
    cross_attention: list[np.ndarray] = field(default_factory=list)  # per step (L, h, S)

    @property
    def score(self) -> float:
        return float(sum(self.token_scores))


@dataclass
class DecodeResult:
    hypotheses: list[Hypothesis]  # best first
    encoder_attention: np.ndarray | None  # (L, h, S, S)


@dataclass
class _Job:
    key: Hashable
    request: DecodeRequest
    encoder_attention: np.ndarray | None
    finished: list[Hypothesis] = field(default_factory=list)


_Attention = tuple[list[np.ndarray], list[np.ndarray]]  # one row's self- and cross-attention rows, per step


class _Rows:
    """The batch's rows as arrays, entry r for cache row r. A hole (a row whose request left) has job -1."""

    ARRAYS = (
        "job", "width", "limit", "start", "alive", "scored", "length", "last", "score", "tokens", "token_scores",
    )  # fmt: skip

    def __init__(self, n: int = 0, columns: int = 16) -> None:
        self.job = np.full(n, -1, np.int64)  # request number (BatchDecoder.jobs); -1: a hole
        self.width = np.ones(n, np.int64)  # 0: forced decoding, 1: greedy, k ≥ 2: one of k beam rows
        self.limit = np.ones(n, np.int64)  # tokens at most
        self.start = np.zeros(n, np.int64)  # first cache slot this row owns
        self.alive = np.zeros(n, bool)  # False: a beam row before its first hypothesis (or a hole)
        self.scored = np.zeros(n, bool)  # its log-probabilities are needed (beam search, or the request asked)
        self.length = np.zeros(n, np.int64)  # tokens generated (0 for a hole: its position id)
        self.last = np.zeros(n, np.int64)  # the last token generated (decoder_start_id before the first)
        self.score = np.zeros(n)  # their summed log-probabilities (float64, summed in order like Hypothesis.score)
        self.tokens = np.zeros((n, columns), np.int64)  # [:, :length]
        self.token_scores = np.zeros((n, columns))
        self.attention: list[_Attention | None] = [None] * n  # only for requests that collect attention

    def __len__(self) -> int:
        return len(self.job)

    def take(self, ix: np.ndarray) -> _Rows:
        """Rows ``ix`` (a row may repeat: beams); attention lists are shared until a step appends to them."""
        rows = _Rows.__new__(_Rows)
        for name in self.ARRAYS:
            setattr(rows, name, getattr(self, name)[ix])
        rows.attention = [self.attention[i] for i in ix.tolist()]
        return rows

    def head(self, n: int) -> _Rows:
        """The first n rows, as views (no copy)."""
        rows = _Rows.__new__(_Rows)
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
        self.join(_Rows(n, self.tokens.shape[1]))

    def join(self, other: _Rows) -> None:
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

    def hypothesis(self, r: int) -> Hypothesis:
        n = int(self.length[r])
        scores = self.token_scores[r, :n].tolist() if self.scored[r] else [math.nan] * n  # unscored: never written
        hyp = Hypothesis(self.tokens[r, :n].tolist(), scores)
        if (attention := self.attention[r]) is not None:
            hyp.self_attention, hyp.cross_attention = list(attention[0]), list(attention[1])
        return hyp


class _Scores:
    """One step's log-probabilities, log p(v | row) = logits[row, v] - log_norm[row], without writing the (N, V)
    array of them out: choosing tokens reads the logits, and only the chosen tokens' log-probabilities are formed.
    The log-normalizers and the block maxima that :func:`beam_top` ranks by come from C (service/_beam.c)."""

    def __init__(self, logits: np.ndarray, scored: np.ndarray) -> None:
        """``scored`` (N,) bool: the rows whose log-normalizer and block maxima are needed (beam rows always;
        greedy rows only when their request asked for scores: the others' log_norm is NaN, and a step whose rows
        need no scores builds no _Scores at all)."""
        self.logits = logits  # (N, V) float32, C-contiguous; padding already -inf
        N, V = logits.shape
        self.log_norm = np.full(N, np.nan, np.float32)
        # (N, V / BLOCK): the largest logit of tokens b BLOCK .. (b + 1) BLOCK - 1
        self.block_max = np.full((N, -(-V // _beam.BLOCK)), np.nan, np.float32)
        _beam.scores(logits, np.flatnonzero(scored), self.log_norm, self.block_max)

    def logp(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.logits[rows, tokens] - self.log_norm[rows]  # float32, as the logits


def beam_top(scores: _Scores, rows: np.ndarray, hyp_scores: np.ndarray, n: int) -> tuple[np.ndarray, ...]:
    """The n best continuations of each of J requests with k rows each, ranked together.

    Args:
        rows: (J, k) batch rows of each request.
        hyp_scores: (J, k) the rows' hypothesis log-probabilities; -inf for a row not alive yet.
    Returns:
        (request, row, token, value) arrays, request by request, best first (ties by row then token), at most n
        a request and only finite values; value = hypothesis score + log p(token | row).

    Exact in two passes (service/_beam.c): the n-th best block value (hypothesis score + a block's largest
    log-probability) is a cut that at least n continuations reach, and every continuation above it lies in a block
    above it; only those blocks' tokens are ranked.
    """
    J = len(rows)
    j, r, t = (np.empty(J * n, np.int64) for _ in range(3))
    value = np.empty(J * n)
    count = _beam.top(
        scores.logits, scores.log_norm, scores.block_max, np.ascontiguousarray(rows, np.int64),
        np.ascontiguousarray(hyp_scores, np.float64), n, j, r, t, value,
    )  # fmt: skip
    return j[:count], r[:count], t[:count], value[:count]


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


@dataclass(frozen=True)
class _Plan:
    """What a step does with a batch's rows; the same every step until rows join or leave."""

    one: np.ndarray  # greedy and forced rows
    forced: list[int]  # forced rows
    widths: list[int]  # beam sizes of the batch's beam rows
    scored: bool  # some row needs log-probabilities
    attends: bool  # some row collects attention

    @classmethod
    def of(cls, rows: _Rows) -> _Plan:
        live = rows.job >= 0
        beam = live & (rows.width >= 2)
        one = np.flatnonzero(live ^ beam)
        return cls(
            one=one,
            forced=one[rows.width[one] == 0].tolist(),
            widths=np.unique(rows.width[beam]).tolist() if beam.any() else [],
            scored=bool((live & rows.scored).any()),
            attends=any(a is not None for a in rows.attention),  # a hole's is None
        )


PACK_WIDTH = 32  # encoder row length that texts are packed into (a longer text gets a row of its own length)


def pack(lengths: np.ndarray, width: int = PACK_WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """Place texts of ``lengths`` one after another in encoder rows of ``max(width, longest)`` tokens, longest
    first, each into the first row with room (first-fit decreasing); or one text a row, when packing would not encode
    fewer tokens than padding every text to the longest (texts of about one length). Returns each text's row and
    start in it.

    The encoder's cost follows rows × row length (the longest text's, when padded), and one call's fixed cost is
    paid once: measured on the shipped model, 4 texts of the test set in 2.1 ms packed instead of 2.7 ms padded,
    8 in 3.7 instead of 6.6. Texts in one row do not see each other (the encoder's segment mask), so packing
    changes no answer.
    """
    width = max(width, int(lengths.max()))
    row, start = np.zeros_like(lengths), np.zeros_like(lengths)
    used: list[int] = []  # tokens taken in each row
    for i in np.argsort(-lengths, kind="stable").tolist():
        r = next((r for r, u in enumerate(used) if u + lengths[i] <= width), len(used))
        if r == len(used):
            used.append(0)
        row[i], start[i] = r, used[r]
        used[r] += int(lengths[i])
    if len(used) * max(used) >= len(lengths) * int(lengths.max()):  # (one text a row, too)
        return np.arange(len(lengths)), np.zeros_like(lengths)
    return row, start


@dataclass
class _Encoded:
    """Requests encoded in one call, until they join a batch: request i's cross keys and values are at columns
    ``start[i]:start[i] + lengths[i]`` of row ``row[i]`` of each decoder layer's (rows, h, W, d_k) caches."""

    keys: list[Hashable]
    requests: list[DecodeRequest]
    lengths: np.ndarray  # (n,) source tokens
    row: np.ndarray  # (n,)
    start: np.ndarray  # (n,)
    cross_keys: list[Cache]
    cross_values: list[Cache]
    attentions: list[np.ndarray | None]  # encoder attention (L, h, S_i, S_i) of the requests that collect it
    tensors: Tensors
    left: set[int] = field(init=False)  # the requests that have not joined a batch (nor been cancelled)

    def __post_init__(self) -> None:
        self.left = set(range(len(self.keys)))

    def cross(self, ix: np.ndarray) -> tuple[list[Cache], list[Cache]]:
        """Cross keys and values (n, h, S, d_k) of requests ``ix`` (one may repeat: a beam request's rows), S the
        longest of their sources; slots past a source's end are masked out. One copy, or none when they are the
        encoder's rows as they are."""
        S, W = int(self.lengths[ix].max()), int(self.tensors.shape(self.cross_keys[0])[2])
        caches = (self.cross_keys, self.cross_values)
        if S == W and np.array_equal(ix, np.arange(len(self.keys))) and np.array_equal(self.row, ix):
            return caches
        if not isinstance(self.tensors, HostTensors):  # one text a row
            take, narrow = self.tensors.take, self.tensors.narrow
            keys, values = ([narrow(take(c, ix), 2, 0, S) for c in layers] for layers in caches)
            return keys, values
        at = np.minimum(self.start[ix][:, None] + np.arange(S), W - 1)  # (n, S) columns of each one's row
        of = self.row[ix][:, None]
        keys, values = ([c[of, :, at].transpose(0, 2, 1, 3) for c in layers] for layers in caches)
        return keys, values

    def copy_into(
        self, cross_keys: list[np.ndarray], cross_values: list[np.ndarray], at: np.ndarray, ix: np.ndarray
    ) -> None:
        """Write the cross keys and values of requests ``ix`` (host caches) into rows ``at`` of a batch's, straight
        out of the encoder rows they were packed into; the rest of those rows zero (masked columns)."""
        row, start, used = self.row[ix], self.start[ix], self.lengths[ix]
        for mine, theirs in zip((*cross_keys, *cross_values), (*self.cross_keys, *self.cross_values), strict=True):
            _beam.copy_spans(mine, at, theirs, row, start, used)


def encode(runner: Runner, requests: list[tuple[Hashable, DecodeRequest]]) -> tuple[_Encoded, float]:
    """Encode requests in one encoder call; returns them and the encoder seconds.

    With host caches the sources are packed (:func:`pack`): several texts share an encoder row and nobody's padding
    is encoded; each text's cross keys and values are gathered from its row when it joins a batch. Device caches
    (IOBinding) stay one text a row: gathering texts out of rows would need graphs of its own.
    """
    spec, tensors = runner.spec, runner.tensors
    lengths = np.array([len(r.src) for _, r in requests])
    row, start = pack(lengths) if isinstance(tensors, HostTensors) else (np.arange(len(lengths)), 0 * lengths)
    W = int((start + lengths).max())
    ids = np.full((int(row.max()) + 1, W), spec.pad_id, np.int64)
    segments = np.zeros_like(ids)
    positions = np.tile(np.arange(W), (len(ids), 1))  # padding too, as an unpacked batch always had
    for i, (_, r) in enumerate(requests):
        at = (row[i], slice(start[i], start[i] + lengths[i]))
        ids[at], segments[at], positions[at] = r.src, i + 1, np.arange(lengths[i])
    t0 = time.perf_counter()
    enc = runner.encode(ids, segments, positions)
    seconds = time.perf_counter() - t0
    weights = enc.attentions
    assert weights is not None or not any(r.attention for _, r in requests), "this encoder gives no attentions"
    attentions = [
        weights[:, row[i], :, start[i] : start[i] + lengths[i], start[i] : start[i] + lengths[i]].copy()
        if r.attention and weights is not None else None
        for i, (_, r) in enumerate(requests)
    ]  # fmt: skip
    keys, texts = [k for k, _ in requests], [r for _, r in requests]
    return _Encoded(keys, texts, lengths, row, start, enc.cross_keys, enc.cross_values, attentions, tensors), seconds


class _Batch:
    """Rows decoded by one decoder call a step, padded to one cache length T and one source length S.

    The rows of a finished or cancelled request become holes rather than being copied out at once: newcomers take
    their places (their cache rows written in place; when the holes are too few, the batch grows by the rest, without
    compacting first), and the batch is compacted only when holes are a quarter of it and either MIN_HOLES or more,
    or nobody joined for QUIET steps. A hole is still computed by the decoder, and ignored.

    While every row is a beam row of one width G (a runner whose fast decoder groups rows, host buffers), the cross
    caches and the encoder mask hold one source a request, for rows gG .. gG + G - 1 (a request's rows, from admission
    to leaving; holes come in whole groups too), and cross-attention runs one query group a source; the first other
    row to join ungroups them (a copy of the cross caches, once).
    """

    # Under bench/peers.py's mixed load (one thread, 220 requests/s), compacting whenever a quarter of a small batch
    # were holes, then growing it again for the next newcomer (a copy of every cache each time, buffers sized by the
    # longest row) took 3–5 s of 15: short requests' p99 206 ms, 63 ms with these rules. An offline batch, where
    # nobody joins, still compacts as soon as a quarter are holes (without QUIET greedy decodes 8 % slower).
    MIN_HOLES, QUIET = 8, 8

    def __init__(self, runner: Runner, numbers: Iterator[int]) -> None:
        self.runner = runner
        self.spec: ModelSpec = runner.spec
        self.tensors = runner.tensors
        self.in_place = runner.in_place  # caches written in place: a row's tokens at its start, no self_mask
        self.host_in_place = self.in_place and isinstance(self.tensors, HostTensors)  # numpy buffers, in place
        self._numbers = numbers  # request numbers, shared by the batches of one BatchDecoder
        self.reset()

    def reset(self) -> None:
        """Forget every row (after a runner failure, or when the last row left)."""
        self.rows = _Rows()
        self._plan: _Plan | None = None  # of self.rows; None when rows joined or left since
        self.jobs: dict[int, _Job] = {}  # by request number (_Rows.job)
        self.quiet = 0  # steps since requests last joined
        L, h, d_k = self.spec.n_decoder_layers, self.spec.h, self.spec.d_k
        empty = self.tensors.empty((0, h, 0, d_k))
        self.past_keys: list[Cache] = [empty] * L
        self.past_values: list[Cache] = [empty] * L
        self.self_mask = np.zeros((0, 0), np.int64)  # (N, T)
        self.cross_keys: list[Cache] = [empty] * L
        self.cross_values: list[Cache] = [empty] * L
        self.encoder_mask = np.zeros((0, 0), np.int64)  # (N / G, S)
        self.group = 1  # G: rows a source's cross keys and values serve (cross caches (N / G, h, S, d_k))

    @property
    def num_rows(self) -> int:
        """Rows that decode a request (holes not counted)."""
        return int(np.count_nonzero(self.rows.job >= 0))

    @property
    def plan(self) -> _Plan:
        if self._plan is None:
            self._plan = _Plan.of(self.rows)
        return self._plan

    @property
    def keys(self) -> set[Hashable]:
        return {job.key for job in self.jobs.values()}

    @property
    def slots(self) -> int:
        """T: the cache length."""
        return int(self.self_mask.shape[1])

    @property
    def width(self) -> int:
        """S: the padded source length."""
        return int(self.encoder_mask.shape[1])

    def split(self, ix: np.ndarray) -> _Batch:
        """Move rows ``ix`` (every row of their requests) into a new batch that keeps only the cache slots and
        source columns they use; here they become holes."""
        other = _Batch(self.runner, self._numbers)
        first, T = int(self.rows.start[ix].min()), self.slots
        S = int(self.encoder_mask[ix].sum(axis=1).max())
        take, narrow = self.tensors.take, self.tensors.narrow
        other.past_keys = [narrow(take(k, ix), 2, first, T) for k in self.past_keys]
        other.past_values = [narrow(take(v, ix), 2, first, T) for v in self.past_values]
        other.cross_keys = [narrow(take(k, ix), 2, 0, S) for k in self.cross_keys]
        other.cross_values = [narrow(take(v, ix), 2, 0, S) for v in self.cross_values]
        other.self_mask = np.ascontiguousarray(self.self_mask[ix, first:])
        other.encoder_mask = np.ascontiguousarray(self.encoder_mask[ix, :S])
        other.rows = self.rows.take(ix)
        other.rows.start -= first
        other.jobs = {number: self.jobs.pop(number) for number in set(other.rows.job.tolist())}
        self._leave(ix)
        self._tidy()
        return other

    def absorb(self, other: _Batch) -> None:
        """Take every row of ``other``, which is left empty. Caches are aligned at their ends: a row owns the last
        slots of its cache (from its start on), so the shorter batch gains masked slots in front."""
        self._compact()
        other._compact()
        T, S = max(self.slots, other.slots), max(self.width, other.width)
        tensors = self.tensors

        def align(b: _Batch) -> None:
            front = T - b.slots
            b.past_keys = [tensors.pad(k, 2, front, front=True) for k in b.past_keys]
            b.past_values = [tensors.pad(v, 2, front, front=True) for v in b.past_values]
            b.self_mask = np.pad(b.self_mask, ((0, 0), (front, 0)))
            b.rows.start += front
            b.cross_keys = [tensors.pad(k, 2, S - b.width) for k in b.cross_keys]
            b.cross_values = [tensors.pad(v, 2, S - b.width) for v in b.cross_values]
            b.encoder_mask = np.pad(b.encoder_mask, ((0, 0), (0, S - b.width)))

        align(self)
        align(other)
        join = lambda mine, theirs: [tensors.cat(x, y) for x, y in zip(mine, theirs, strict=True)]  # noqa: E731
        self.past_keys, self.past_values = (
            join(self.past_keys, other.past_keys),
            join(self.past_values, other.past_values),
        )
        self.cross_keys = join(self.cross_keys, other.cross_keys)
        self.cross_values = join(self.cross_values, other.cross_values)
        self.self_mask = np.concatenate([self.self_mask, other.self_mask])
        self.encoder_mask = np.concatenate([self.encoder_mask, other.encoder_mask])
        self.rows.join(other.rows)
        self._plan = None
        self.jobs.update(other.jobs)
        other.reset()

    def admit(self, enc: _Encoded, ix: list[int]) -> None:
        """Add the rows of requests ``ix`` of ``enc`` (a beam request's k rows share its cross keys and values)."""
        requests, lengths = [enc.requests[i] for i in ix], enc.lengths[ix]
        self.quiet = 0
        width = np.array([0 if r.forced is not None else r.beam_size for r in requests])  # as _Rows.width
        rows_of = np.repeat(np.arange(len(requests)), np.maximum(width, 1))  # new row -> request
        self._regroup(width)
        sources = rows_of if self.group == 1 else np.arange(len(requests))  # new cross cache row -> request
        mask = (np.arange(lengths.max())[None] < lengths[sources][:, None]).astype(np.int64)
        n, T = len(rows_of), self.self_mask.shape[1]
        holes = np.flatnonzero(self.rows.job < 0)
        if len(holes) < n:
            holes = np.concatenate([holes, self._grow(n - len(holes))])
        slots = self._fill(holes[:n].tolist(), enc, np.array(ix, np.int64)[sources], mask)
        numbers = np.array([next(self._numbers) for _ in requests])
        for number, i in zip(numbers.tolist(), ix, strict=True):
            self.jobs[number] = _Job(enc.keys[i], enc.requests[i], enc.attentions[i])
        at, rows = np.array(slots, np.int64), self.rows
        limit = np.array([len(r.forced) if r.forced is not None else r.max_length for r in requests])
        rows.job[at], rows.width[at], rows.limit[at] = numbers[rows_of], width[rows_of], limit[rows_of]
        rows.start[at], rows.length[at], rows.last[at], rows.score[at] = T, 0, self.spec.decoder_start_id, 0.0
        rows.alive[at] = np.concatenate([[True], rows_of[1:] != rows_of[:-1]])  # a request's first row
        rows.scored[at] = (np.array([r.scores for r in requests]) | (width >= 2))[rows_of]
        for slot, i in zip(slots, rows_of.tolist(), strict=True):
            rows.attention[slot] = ([], []) if requests[i].attention else None
        self._plan = None

    def _regroup(self, width: np.ndarray) -> None:
        """Before rows of beam ``width`` join: group the cross caches by a beam width when the batch is empty and
        every newcomer is a beam row of that width; ungroup them when a newcomer is not."""
        k = int(width[0])
        if not len(self.rows):
            grouped = self.runner.grouped and self.host_in_place and k >= 2 and bool((width == k).all())
            self.group = k if grouped else 1
        elif self.group > 1 and not (width == self.group).all():
            G, self.group = self.group, 1
            self.cross_keys = [np.repeat(c, G, axis=0) for c in self.cross_keys]
            self.cross_values = [np.repeat(c, G, axis=0) for c in self.cross_values]
            self.encoder_mask = np.repeat(self.encoder_mask, G, axis=0)

    def _sources(self, rows: np.ndarray) -> np.ndarray:
        """The cross caches' rows of batch rows ``rows`` (whole groups, in order, when grouped)."""
        return rows[:: self.group] // self.group

    def _fill(self, slots: list[int], enc: _Encoded, which: np.ndarray, mask: np.ndarray) -> list[int]:
        """Write new rows (the cross keys and values of requests ``which`` of ``enc``, and their encoder mask) into
        holes, in place: no other row's self-attention cache is copied (the cross caches are, once, when a new
        source is longer than S). Their old cache slots stay, masked."""
        tensors, ix = self.tensors, np.array(slots, np.int64)
        at = self._sources(ix)
        S, S_new = self.encoder_mask.shape[1], mask.shape[1]
        fresh = S == 0 and len(at) == len(self.encoder_mask)  # an empty batch: every row is a newcomer's
        if fresh and isinstance(tensors, HostTensors):  # their caches become its own (the encoder's, when unshared)
            keys, values = enc.cross(which)
            self.cross_keys, self.cross_values = ([np.ascontiguousarray(c) for c in cs] for cs in (keys, values))
            self.encoder_mask = mask
        elif S_new > S:
            self.cross_keys = [tensors.pad(k, 2, S_new - S) for k in self.cross_keys]
            self.cross_values = [tensors.pad(v, 2, S_new - S) for v in self.cross_values]
            self.encoder_mask = np.pad(self.encoder_mask, ((0, 0), (0, S_new - S)))
        if self.encoder_mask is not mask:
            if isinstance(tensors, HostTensors):  # straight out of the encoder's rows
                enc.copy_into(self.cross_keys, self.cross_values, at, which)
            else:
                keys, values = enc.cross(which)
                self.cross_keys = [tensors.put(c, at, k) for c, k in zip(self.cross_keys, keys, strict=True)]
                self.cross_values = [tensors.put(c, at, v) for c, v in zip(self.cross_values, values, strict=True)]
            self.encoder_mask[at] = 0
            self.encoder_mask[at, :S_new] = mask
        self.self_mask[ix] = 0  # the new rows own no cache slot yet
        return slots

    def _grow(self, m: int) -> np.ndarray:
        """Add m holes at the end (a copy of every cache), for newcomers that the holes cannot take; their rows."""
        N, sources = len(self.rows), m // self.group
        self.cross_keys = [self._grown(k, sources) for k in self.cross_keys]
        self.cross_values = [self._grown(v, sources) for v in self.cross_values]
        self.encoder_mask = np.pad(self.encoder_mask, ((0, sources), (0, 0)))
        self.past_keys = [self._moved(k, rows=N + m) for k in self.past_keys]
        self.past_values = [self._moved(v, rows=N + m) for v in self.past_values]
        self.self_mask = np.concatenate([self.self_mask, np.zeros((m, self.self_mask.shape[1]), np.int64)])
        self.rows.extend(m)
        return np.arange(N, N + m)

    def _grown(self, cache: Cache, m: int) -> Cache:
        """A cross-attention cache with m more rows, for newcomers to write. With host buffers (written in place),
        the rows after it in the array that it is the first rows of, while there is room (no copy), else a new array
        with room for twice the rows (as :meth:`_moved`)."""
        if not self.host_in_place:
            return self.tensors.pad(cache, 0, m)
        N, whole = len(cache), _whole(cache)
        if N + m <= len(whole):
            return whole[: N + m]
        out = np.empty((max(N + m, 2 * N), *cache.shape[1:]), cache.dtype)
        out[:N] = cache
        return out[: N + m]

    def cancel(self, key: Hashable) -> None:
        """Drop the rows of a request whose caller went away."""
        for number in [number for number, job in self.jobs.items() if job.key == key]:
            self._leave(np.flatnonzero(self.rows.job == number))
            del self.jobs[number]
        self._tidy()

    def _leave(self, ix: np.ndarray) -> None:
        """Rows ``ix`` become holes; a hole attends to nothing but its newest slot."""
        self.rows.job[ix], self.rows.length[ix] = -1, 0
        self.rows.alive[ix] = False
        self._plan = None
        self.self_mask[ix] = 0
        for i in ix.tolist():
            self.rows.attention[i] = None

    def step(self) -> tuple[list[tuple[Hashable, DecodeResult]], float]:
        """One decoder call for every row; returns the requests that finished and the decoder seconds."""
        rows, spec, plan = self.rows, self.spec, self.plan
        self.quiet += 1
        if not (len(plan.one) or plan.widths):
            return [], 0.0
        N = len(rows)
        if self.in_place:
            self_mask, slots = None, self._reserve(int(rows.length.max()) + 1)
        else:
            self_mask = np.concatenate([self.self_mask, np.ones((N, 1), np.int64)], axis=1)
            slots = self_mask.shape[1]
        # Greedy rows only, unscored: the graph's own greedy tokens, no logits (Runner.greedy_tokens).
        greedy = self.runner.greedy_tokens and not (plan.widths or plan.forced or plan.scored)
        t0 = time.perf_counter()
        out = self._decoder_step(rows.last[:, None], rows.length[:, None], self_mask, greedy)
        seconds = time.perf_counter() - t0
        self.past_keys, self.past_values = out.present_keys, out.present_values
        if self_mask is not None:
            self.self_mask = self_mask
        logits = out.logits.astype(np.float32, copy=False)  # float16 graphs would give float16
        logits[:, spec.pad_id] = -np.inf  # never emit padding
        scores = _Scores(logits, rows.scored) if plan.scored else None

        # Each live row's next token and the row it continues (its parent: itself, or a beam of its request).
        done: list[int] = []  # request numbers finished in this step
        finals: list[tuple[int, int]] = []  # (request number, new row) hypotheses that finish at max_length
        one = plan.one  # greedy and forced rows
        if out.tokens is not None:  # asked for (greedy)
            token = out.tokens
        elif not plan.widths:  # every row greedy or forced (or a hole: its token is never read)
            token = logits.argmax(axis=-1)
        else:
            token = np.zeros(N, np.int64)
            token[one] = logits[one].argmax(axis=-1)
        for r in plan.forced:
            forced = self.jobs[int(rows.job[r])].request.forced
            assert forced is not None
            token[r] = forced[rows.length[r]]
        ix, parent = one, None  # the rows that hold a continued hypothesis after this step, and their parents
        if plan.widths:
            assert scores is not None, "beam rows are scored"
            everyone = np.arange(N)
            parent, stepped = everyone.copy(), np.zeros(N, bool)
            stepped[one] = True
            for k in plan.widths:
                self._beam(k, scores, out, parent, token, stepped, done, finals)
            ix = np.flatnonzero(stepped)
            if len(moved := np.flatnonzero(parent != everyone)):  # rows that continue another row's hypothesis
                src = parent[moved]
                rows.move(moved, src)
                if self.host_in_place:  # only the slots they hold tokens in (this step's is written, not counted)
                    self._copy_slots(moved, src, rows.length[moved] + 1)
                else:
                    put, take = self.tensors.put, self.tensors.take
                    self.past_keys = [put(k, moved, take(k, src)) for k in self.past_keys]
                    self.past_values = [put(v, moved, take(v, src)) for v in self.past_values]
            rows.alive = stepped  # a beam row that got no child holds no hypothesis until it gets one
        parents = ix if parent is None else parent[ix]  # the logits rows the tokens come from
        n, chosen = rows.length[ix], token[ix]
        rows.reserve(slots)  # a row generates one token a cache slot it owns
        rows.tokens[ix, n] = rows.last[ix] = chosen
        if scores is not None:  # (an unscored row's token scores are NaN, filled in by _Rows.hypothesis)
            logp = scores.logp(parents, chosen)
            rows.token_scores[ix, n] = logp
            rows.score[ix] += logp
        rows.length[ix] += 1
        if plan.attends:
            self._attend(ix, parents, out)

        for r in one[(token[one] == spec.eos_id) | (rows.length[one] >= rows.limit[one])].tolist():
            number = int(rows.job[r])
            self.jobs[number].finished.append(rows.hypothesis(r))
            done.append(number)
        for number, r in finals:
            self.jobs[number].finished.append(rows.hypothesis(r))
        if not done:
            return [], seconds
        self._leave(np.flatnonzero(np.equal.outer(rows.job, done).any(axis=1)))
        results = [(self.jobs[number].key, self._result(self.jobs.pop(number))) for number in done]
        self._tidy()
        return results, seconds

    def _decoder_step(
        self, ids: np.ndarray, positions: np.ndarray, self_mask: np.ndarray | None, tokens: bool = False
    ) -> StepOutput:
        """The decoder on every row (``tokens``: greedy tokens instead of logits, :meth:`Runner.step`); on a batch
        with no cache yet, only on the rows that hold a hypothesis (a beam request's other rows start empty): beam k
        computes one row a request in its first step, not k."""
        rows, tensors = self.rows, self.tensors
        if self.host_in_place and not rows.alive.all() and not rows.length.any():
            return self._first_step(ids, positions)
        if self_mask is None or self.self_mask.shape[1] or rows.alive.all():
            caches = (self.cross_keys, self.cross_values, self.past_keys, self.past_values)
            return self.runner.step(ids, positions, self.encoder_mask, self_mask, *caches, tokens=tokens)
        run = np.flatnonzero(rows.alive)
        cross_keys, cross_values, past_keys, past_values = (
            [tensors.take(c, run) for c in caches]
            for caches in (self.cross_keys, self.cross_values, self.past_keys, self.past_values)
        )
        out = self.runner.step(
            ids[run], positions[run], self.encoder_mask[run], self_mask[run], cross_keys, cross_values, past_keys,
            past_values,
        )  # fmt: skip
        N = len(rows)

        def spread(x: np.ndarray | Cache, axis: int = 0) -> np.ndarray | Cache:
            """Rows ``run`` of N; the others zeros."""
            if not isinstance(x, np.ndarray):  # a device cache
                shape = tensors.shape(x)
                return tensors.put(tensors.pad(tensors.empty((0, *shape[1:])), 0, N), run, x)
            full = np.zeros((*x.shape[:axis], N, *x.shape[axis + 1 :]), x.dtype)
            full[(slice(None),) * axis + (run,)] = x
            return full

        attention = [None if a is None else spread(a, axis=1) for a in (out.self_attentions, out.cross_attentions)]
        return StepOutput(
            spread(out.logits),  # an empty row is no hypothesis: its (finite) logits are never ranked
            [spread(k) for k in out.present_keys],
            [spread(v) for v in out.present_values],
            *attention,
        )

    def _first_step(self, ids: np.ndarray, positions: np.ndarray) -> StepOutput:
        """:meth:`_decoder_step` with host buffers written in place, while no row holds a token: the rows that hold
        a hypothesis step on buffers of their own, whose first slot is then copied into the batch's (a batch of
        32 beam-4 requests computes 32 rows in its first step, not 128: float32 8.3 against 2.3 ms)."""
        rows = self.rows
        run = np.flatnonzero(rows.alive)
        at = run // self.group  # their sources
        if np.array_equal(at, np.arange(len(self.encoder_mask))):
            cross_keys, cross_values, encoder_mask = self.cross_keys, self.cross_values, self.encoder_mask
        else:
            cross_keys, cross_values = [c[at] for c in self.cross_keys], [c[at] for c in self.cross_values]
            encoder_mask = self.encoder_mask[at]
        past_keys, past_values = ([np.empty((len(run), *c.shape[1:]), c.dtype) for c in caches]
                                  for caches in (self.past_keys, self.past_values))  # fmt: skip
        out = self.runner.step(
            ids[run], positions[run], encoder_mask, None, cross_keys, cross_values, past_keys, past_values
        )
        for full, mine in zip((*self.past_keys, *self.past_values), (*past_keys, *past_values), strict=True):
            full[run, :, :1] = mine[:, :, :1]
        logits = np.zeros((len(rows), out.logits.shape[1]), out.logits.dtype)
        logits[run] = out.logits  # an empty row is no hypothesis: its (finite) logits are never ranked
        return StepOutput(logits, self.past_keys, self.past_values, None, None)

    def _beam(
        self,
        k: int,
        scores: _Scores,
        out: StepOutput,
        parent: np.ndarray,
        token: np.ndarray,
        stepped: np.ndarray,
        done: list[int],
        finals: list[tuple[int, int]],
    ) -> None:
        """Beam search for the requests with k rows: the best 2k continuations of their live hypotheses; the
        </s> ones among the best k finish, the best k others continue in the request's rows (their parents and
        tokens are written into ``parent`` and ``token``, and ``stepped`` marks those rows)."""
        rows, eos = self.rows, self.spec.eos_id
        mine = np.flatnonzero((rows.job >= 0) & (rows.width == k))
        ix = mine[np.lexsort((mine, rows.job[mine]))].reshape(-1, k)  # (J, k): a request's rows in batch order
        hyp_scores = np.where(rows.alive[ix], rows.score[ix], -np.inf)
        j, r, v, _ = beam_top(scores, ix, hyp_scores, 2 * k)
        first = np.searchsorted(j, j)
        rank = np.arange(len(j)) - first
        ends = v == eos
        for p in r[ends & (rank < k)].tolist():  # finished hypotheses: the parent's, plus </s>
            hyp = rows.hypothesis(p)
            hyp.tokens.append(eos)
            hyp.token_scores.append(float(scores.logp(np.array([p]), np.array([eos]))[0]))
            if rows.attention[p] is not None:
                self_row, cross_row = self._attention_rows(out, p)
                hyp.self_attention.append(self_row)
                hyp.cross_attention.append(cross_row)
            self.jobs[int(rows.job[p])].finished.append(hyp)
        going = np.cumsum(~ends) - np.cumsum(~ends)[first] + ~ends[first]  # 1-based place among the request's others
        child = ~ends & (going <= k)
        cj, cr = j[child], r[child]  # the children's requests and parents, request by request, best first
        slot = beam_places(ix, cj, cr)
        parent[slot], token[slot], stepped[slot] = cr, v[child], True
        children = np.bincount(cj, minlength=len(ix))
        t = rows.length[ix[:, 0]] + 1
        at_limit = t >= rows.limit[ix[:, 0]]
        for q in range(len(ix)):
            number = int(rows.job[ix[q, 0]])
            if len(self.jobs[number].finished) >= k or at_limit[q] or not children[q]:
                done.append(number)
                if at_limit[q]:
                    finals.extend((number, int(s)) for s in slot[cj == q])

    def _attention_rows(self, out: StepOutput, r: int) -> tuple[np.ndarray, np.ndarray]:
        """This step's self- and cross-attention rows of row r (computed from its own hypothesis)."""
        assert out.self_attentions is not None and out.cross_attentions is not None, "no attention outputs"
        source = len(self.jobs[int(self.rows.job[r])].request.src)
        start = int(self.rows.start[r])
        return out.self_attentions[:, r, :, start:].copy(), out.cross_attentions[:, r, :, :source].copy()

    def _attend(self, ix: np.ndarray, parents: np.ndarray, out: StepOutput) -> None:
        """Append this step's attention rows to those of rows ``ix`` that collect attention, each computed in its
        parent's row (``parents``, this step's rows)."""
        rows = self.rows
        for i, p in zip(ix.tolist(), parents.tolist(), strict=True):
            if (attention := rows.attention[i]) is not None:
                self_row, cross_row = self._attention_rows(out, p)
                rows.attention[i] = ([*attention[0], self_row], [*attention[1], cross_row])

    def _result(self, job: _Job) -> DecodeResult:
        lp = job.request.length_penalty
        ranked = sorted(job.finished, key=lambda h: -h.score / max(len(h.tokens), 1) ** lp)
        return DecodeResult(ranked[: max(job.request.n_best, 1)], job.encoder_attention)

    def _reserve(self, slots: int) -> int:
        """With caches written in place: room for ``slots`` slots a row (the buffers grow, doubling); their
        capacity."""
        capacity = self.tensors.shape(self.past_keys[0])[2]
        if slots > capacity:
            capacity = max(slots, 2 * capacity, 16)
            self.past_keys = [self._moved(k, capacity=capacity) for k in self.past_keys]
            self.past_values = [self._moved(v, capacity=capacity) for v in self.past_values]
        return capacity

    def _tidy(self) -> None:
        """After rows left: compact when holes are a quarter of the batch (see MIN_HOLES), then trim what no row
        needs."""
        live = np.flatnonzero(self.rows.job >= 0)
        if not len(live):
            self.reset()
            return
        holes = len(self.rows) - len(live)
        if holes * 4 >= len(self.rows) and (holes >= self.MIN_HOLES or self.quiet >= self.QUIET):
            self._compact()
        self._trim()

    def _moved(self, cache: Cache, rows: np.ndarray | int | None = None, capacity: int | None = None) -> Cache:
        """A self-attention cache with rows ``rows`` (an index: those rows; a count: every row, then empty ones up
        to that many) and ``capacity`` slots.

        Buffers written in place on the host are the first rows of an array with room for more: rows that join
        take the rows after them while there is room (no copy: a new row's slots are written before they are read),
        and a new array gets room for twice the rows. Into a new array, only the slots that each row holds tokens
        in are copied, and the rest are left as they come (the fast decoder reads a row's slots below its length
        only, tests/model/test_export.py): one long row makes the buffers many times what the others use. Copying
        every slot whenever rows joined took 5 of 15 s of a mixed load (bench/peers.py's); then every row's slots
        up to the longest one's length, 0.43-0.48 s of 15 (0.09-0.11 s with room and each row's own length, three
        runs each, interleaved); zeroing the new slots took 0.1 of 2.5 s of beam search (bench/peers.py's runner,
        int8)."""
        tensors = self.tensors
        N, h, C, d_k = tensors.shape(cache)
        capacity = C if capacity is None else capacity
        if not self.host_in_place:
            if isinstance(rows, int):
                cache = tensors.pad(cache, 0, rows - N)
            elif rows is not None:
                cache = tensors.take(cache, rows)
            if capacity < C:
                return tensors.narrow(cache, 2, 0, capacity)
            return cache if capacity == C else tensors.pad(cache, 2, capacity - C)
        assert not isinstance(rows, np.ndarray), "host buffers are compacted in place (_compact)"
        size, whole = N if rows is None else rows, _whole(cache)
        if capacity == C and size <= len(whole):
            return whole[:size]
        room = max(size, 2 * N) if size > N else len(whole)  # rows that join: room for twice the rows
        out = np.empty((room, h, capacity, d_k), cache.dtype)
        every = np.arange(N)
        _beam.copy_rows(out, every, cache, every, self.rows.length)
        return out[:size]

    def _copy_slots(self, dst: np.ndarray, src: np.ndarray, used: np.ndarray) -> None:
        """Rows ``src``'s first ``used`` (one count a row) self-attention cache slots into rows ``dst``, in place
        (host buffers)."""
        dst, src = np.ascontiguousarray(dst, np.int64), np.ascontiguousarray(src, np.int64)
        for cache in (*self.past_keys, *self.past_values):
            _beam.copy_rows(cache, dst, cache, src, used)

    def _compact(self) -> None:
        """No holes left. With host buffers written in place, the live rows past the first n (of n live rows) move
        into the holes among the first n and every array keeps its first n rows, a view: only the moved rows are
        copied (their used slots). Otherwise the live rows are copied out, in order."""
        live = self.rows.job >= 0
        n = int(np.count_nonzero(live))
        if n == len(self.rows):
            return
        self._plan = None
        if not self.host_in_place:
            ix, take = np.flatnonzero(live), self.tensors.take
            self.past_keys = [self._moved(k, ix) for k in self.past_keys]
            self.past_values = [self._moved(v, ix) for v in self.past_values]
            self.self_mask = self.self_mask[ix]
            self.cross_keys = [take(k, ix) for k in self.cross_keys]
            self.cross_values = [take(v, ix) for v in self.cross_values]
            self.encoder_mask = self.encoder_mask[ix]
            self.rows = self.rows.take(ix)
            return
        src, dst = np.flatnonzero(live[n:]) + n, np.flatnonzero(~live[:n])  # whole groups, in order, when grouped
        self._copy_slots(dst, src, self.rows.length[src])
        to, of = self._sources(dst), self._sources(src)
        whole = np.full(len(to), self.width, np.int64)
        for cache in (*self.cross_keys, *self.cross_values):  # whole rows (the batch's own, C-contiguous)
            _beam.copy_rows(cache, to, cache, of, whole)
        self.encoder_mask[to] = self.encoder_mask[of]
        self.rows.move(dst, src)
        self.past_keys, self.past_values = [k[:n] for k in self.past_keys], [v[:n] for v in self.past_values]
        J = n // self.group
        self.cross_keys, self.cross_values = [k[:J] for k in self.cross_keys], [v[:J] for v in self.cross_values]
        self.encoder_mask, self.self_mask = self.encoder_mask[:J], self.self_mask[:n]
        self.rows = self.rows.head(n)

    def _trim(self) -> None:
        """Drop cache slots no live row owns any more, and source columns no live row needs (only when it is worth
        a copy). A hole keeps at least one source column and gets a fresh self-attention slot every step."""
        live = np.flatnonzero(self.rows.job >= 0)
        T, first = self.self_mask.shape[1], int(self.rows.start[live].min())  # in place: T = first = 0
        narrow = self.tensors.narrow
        if self.in_place:  # buffers 4 times what the longest row needs (and 64 slots or more): cut to twice that
            keep = 2 * max(int(self.rows.length[live].max()) + 1, 16)
            if self.tensors.shape(self.past_keys[0])[2] >= 2 * keep:
                self.past_keys = [self._moved(k, capacity=keep) for k in self.past_keys]
                self.past_values = [self._moved(v, capacity=keep) for v in self.past_values]
        elif first > 0 and first * 4 >= T:
            self.past_keys = [narrow(k, 2, first, T) for k in self.past_keys]
            self.past_values = [narrow(v, 2, first, T) for v in self.past_values]
            self.self_mask = np.ascontiguousarray(self.self_mask[:, first:])
            self.rows.start = np.maximum(self.rows.start - first, 0)
        S = int(self.encoder_mask[live // self.group].sum(axis=1).max())
        if self.encoder_mask.shape[1] * 3 >= S * 4:
            self.cross_keys = [narrow(k, 2, 0, S) for k in self.cross_keys]
            self.cross_values = [narrow(v, 2, 0, S) for v in self.cross_values]
            self.encoder_mask = np.ascontiguousarray(self.encoder_mask[:, :S])


def _whole(cache: np.ndarray) -> np.ndarray:
    """The array that ``cache`` is the first rows of (a view of), or ``cache``."""
    base = cache.base
    if not isinstance(base, np.ndarray) or not (base.flags.c_contiguous and cache.flags.c_contiguous):
        return cache
    return base if base.shape[1:] == cache.shape[1:] and base.ctypes.data == cache.ctypes.data else cache


class BatchDecoder:
    """Decodes the rows of many requests together, one step at a time; knows nothing of HTTP or queues.

    Rows sit in at most two batches, one decoder call each a step. Requests join the young batch. Once its cache
    is ``2 * age`` slots long, its rows that have decoded more than ``age`` tokens move to the old batch: one long
    request would otherwise make every row that joins after it attend over (and copy) its long cache, each step.
    A row's answer does not depend on the batch it is in. With caches written in place (``runner.in_place``) a row
    attends over its own tokens only, whatever its neighbours' lengths, and nothing ages: one batch.

    Requests are encoded (:meth:`encode`: one encoder call for many) before they join (:meth:`join`), possibly
    steps later; :meth:`admit` does both at once.
    """

    def __init__(self, runner: Runner, age: int = 32) -> None:
        self.runner = runner
        self.spec: ModelSpec = runner.spec
        self.age = age
        numbers = itertools.count()
        self.young, self.old = _Batch(runner, numbers), _Batch(runner, numbers)
        self.waiting: list[_Encoded] = []  # encoded ahead (:meth:`encode`), until every request of theirs has left

    def reset(self) -> None:
        """Forget every row and every request encoded ahead (after a runner failure)."""
        self.young.reset()
        self.old.reset()
        self.waiting = []

    @property
    def num_rows(self) -> int:
        """Rows that decode a request (holes not counted)."""
        return self.young.num_rows + self.old.num_rows

    @property
    def keys(self) -> set[Hashable]:
        return self.young.keys | self.old.keys

    def source_tokens(self, rows: int = 0, S: int = 0) -> int:
        """Padded source tokens the batches hold, with ``rows`` more rows of ``S`` tokens in the young batch."""
        young, old = self.young, self.old
        return (young.num_rows + rows) * max(young.width, S) + old.num_rows * old.width

    def admit(self, requests: list[tuple[Hashable, DecodeRequest]]) -> float:
        """Encode new requests (one encoder call) and add their rows; returns the encoder seconds."""
        seconds = self.encode(requests)
        self.join([key for key, _ in requests])
        return seconds

    def encode(self, requests: list[tuple[Hashable, DecodeRequest]]) -> float:
        """Encode requests (one encoder call) that :meth:`join` adds later; returns the encoder seconds."""
        if not requests:
            return 0.0
        encoded, seconds = encode(self.runner, requests)
        self.waiting.append(encoded)
        return seconds

    def join(self, keys: list[Hashable]) -> None:
        """Add the rows of requests encoded before (one batch join for each encoder call they came from)."""
        wanted = set(keys)
        for encoded in self.waiting:
            if mine := [i for i in sorted(encoded.left) if encoded.keys[i] in wanted]:
                self.young.admit(encoded, mine)
                encoded.left.difference_update(mine)
        self.waiting = [encoded for encoded in self.waiting if encoded.left]

    def cancel(self, key: Hashable) -> None:
        """Drop the rows of a request whose caller went away (or the request, when it was only encoded)."""
        for batch in (self.young, self.old):
            if key in batch.keys:
                batch.cancel(key)
        for encoded in self.waiting:
            encoded.left.difference_update(i for i, k in enumerate(encoded.keys) if k == key)
        self.waiting = [encoded for encoded in self.waiting if encoded.left]

    def step(self) -> tuple[list[tuple[Hashable, DecodeResult]], float]:
        """One decoder call for each batch; returns the requests that finished and the decoder seconds."""
        done, seconds = [], 0.0
        for batch in (self.old, self.young):
            if batch.num_rows:
                finished, s = batch.step()
                done += finished
                seconds += s
        self._age()
        return done, seconds

    def _age(self) -> None:
        """Move the young batch's old rows to the old batch once its cache is 2 age slots long (never with caches
        written in place: their T stays 0)."""
        young = self.young
        if young.slots < 2 * self.age:
            return
        live = young.rows.job >= 0
        aged = np.flatnonzero(live & (young.slots - young.rows.start > self.age))
        if not len(aged):
            return
        if len(aged) < np.count_nonzero(live):
            moved = young.split(aged)
        elif not self.old.num_rows:
            self.young, self.old = self.old, young  # all of it, nothing to copy
            return
        else:
            moved = young
        if self.old.num_rows:
            self.old.absorb(moved)  # leaves moved empty
        else:
            self.old = moved


def decode(runner: Runner, requests: list[DecodeRequest]) -> list[DecodeResult]:
    """Decode requests as one batch to the end (the CLI, evaluation and tests use this; the service's scheduler
    drives :class:`BatchDecoder` itself)."""
    decoder = BatchDecoder(runner)
    decoder.admit(list(enumerate(requests)))
    results: dict[Hashable, DecodeResult] = {}
    while decoder.num_rows:
        done, _ = decoder.step()
        results.update(done)
    return [results[i] for i in range(len(requests))]
