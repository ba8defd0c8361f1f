"""Batched greedy, beam and forced decoding on the key/value cache, with attention rows collected step by step.

:class:`BatchDecoder` holds the rows (hypotheses) of many requests in one batch. New requests are admitted between
steps and finished ones leave (iteration-level batching); a row that joins late owns only the cache slots from its
start on — the others are masked out (``self_attention_mask``), so a row's answer does not depend on its neighbours.

Cache layout, one cache per decoder layer (the runner's kind: numpy, or device values with IOBinding, handled
through ``runner.tensors``): ``past_keys``/``past_values`` (N, h, T, d_k) for N rows, row r owning slots
``start[r]:T``; ``cross_keys``/``cross_values`` (N, h, S, d_k).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from service.bundle import ModelSpec
from service.runner import Cache, Runner, StepOutput


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
    """

    src: list[int]
    beam_size: int = 1
    max_length: int = 64
    length_penalty: float = 1.0
    n_best: int = 1
    forced: list[int] | None = None
    attention: bool = False


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, ending with </s> unless max_length cut it
    token_scores: list[float]  # log-probability of each token
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
    steps: int = 0


@dataclass
class _Row:
    job: _Job
    hyp: Hypothesis
    start: int  # first cache slot this row owns
    alive: bool = True  # False for the extra beam rows before the first step


class _Scores:
    """One step's log-probabilities, log p(v | row) = logits[row, v] - log_norm[row], without writing the (N, V)
    array of them out: choosing tokens reads the logits, and only the chosen tokens' log-probabilities are formed."""

    BEAM_MARGIN = 10.0  # beam candidates are first sought within this many nats of the best continuation

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits  # (N, V); padding already -inf
        self.best = logits.max(axis=-1)  # (N,)
        shifted = logits - self.best[:, None]
        self.log_norm = self.best + np.log(np.exp(shifted, out=shifted).sum(axis=-1))  # (N,)

    def logp(self, row: int, token: int) -> float:
        return float(self.logits[row, token] - self.log_norm[row])

    def beam_top(self, idx: list[int], scores: np.ndarray, n: int) -> list[tuple[int, int]]:
        """The n best (row, token) continuations of the rows ``idx`` (hypothesis log-probabilities ``scores``,
        -inf for rows not yet alive), best first, ties by row then token; only finite ones.

        Exact: the candidates are every continuation within BEAM_MARGIN of the best one; when fewer than n are
        there, every continuation is ranked.
        """
        base = scores - self.log_norm[idx]  # (k,) continuation score = base[j] + logits[idx[j], v]
        top = float(np.max(base + self.best[idx]))
        if not np.isfinite(top):
            return []
        contiguous = idx[-1] - idx[0] + 1 == len(idx)  # a request's rows stay together: a view, not a copy
        logits = self.logits[idx[0] : idx[-1] + 1] if contiguous else self.logits[idx]  # (k, V)
        flat = np.flatnonzero(logits >= (top - self.BEAM_MARGIN - base)[:, None])  # rows not alive: threshold +inf
        if len(flat) < n:  # a flat distribution: rank everything
            flat = np.arange(logits.size)
        j, v = np.divmod(flat, logits.shape[1])
        value = base[j] + logits[j, v]
        if len(value) > n:
            keep = np.argpartition(-value, n - 1)[:n]
            j, v, value = j[keep], v[keep], value[keep]
        order = np.lexsort((v, j, -value))
        return [(idx[a], int(b)) for a, b, c in zip(j[order], v[order], value[order], strict=True) if np.isfinite(c)]


class BatchDecoder:
    """Decodes the rows of many requests together, one step at a time; knows nothing of HTTP or queues.

    The rows of a finished or cancelled request become holes (``None``) rather than being copied out at once:
    newcomers take their places (their cache rows written in place), and the batch is compacted only when holes
    are a quarter of it. A hole is still computed by the decoder, and ignored.
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.spec: ModelSpec = runner.spec
        self.tensors = runner.tensors
        self.reset()

    def reset(self) -> None:
        """Forget every row (after a runner failure, or when the last row left)."""
        self.rows: list[_Row | None] = []
        L, h, d_k = self.spec.n_decoder_layers, self.spec.h, self.spec.d_k
        empty = self.tensors.empty((0, h, 0, d_k))
        self.past_keys: list[Cache] = [empty] * L
        self.past_values: list[Cache] = [empty] * L
        self.self_mask = np.zeros((0, 0), np.int64)  # (N, T)
        self.cross_keys: list[Cache] = [empty] * L
        self.cross_values: list[Cache] = [empty] * L
        self.encoder_mask = np.zeros((0, 0), np.int64)  # (N, S)

    @property
    def num_rows(self) -> int:
        """Rows that decode a request (holes not counted)."""
        return sum(r is not None for r in self.rows)

    @property
    def keys(self) -> set[Hashable]:
        return {r.job.key for r in self.rows if r is not None}

    def admit(self, requests: list[tuple[Hashable, DecodeRequest]]) -> float:
        """Encode new requests (one encoder call) and add their rows; returns the encoder seconds."""
        if not requests:
            return 0.0
        S_new = max(len(r.src) for _, r in requests)
        ids = np.full((len(requests), S_new), self.spec.pad_id, np.int64)
        for i, (_, r) in enumerate(requests):
            ids[i, : len(r.src)] = r.src
        mask = (np.arange(S_new)[None] < np.array([len(r.src) for _, r in requests])[:, None]).astype(np.int64)
        t0 = time.perf_counter()
        enc = self.runner.encode(ids, mask)
        seconds = time.perf_counter() - t0

        beams = np.array([1 if r.forced is not None else r.beam_size for _, r in requests])
        rows_of = np.repeat(np.arange(len(requests)), beams)  # new row -> request index
        n, T = len(rows_of), self.self_mask.shape[1]
        holes = [i for i, r in enumerate(self.rows) if r is None]
        if len(holes) >= n and S_new <= self.encoder_mask.shape[1]:
            slots = self._fill(holes[:n], enc.cross_keys, enc.cross_values, mask, rows_of)
        else:
            slots = self._append(enc.cross_keys, enc.cross_values, mask, rows_of)
        new_rows = iter(slots)
        for i, (key, r) in enumerate(requests):
            s = len(r.src)
            job = _Job(key, r, enc.attentions[:, i, :, :s, :s].copy() if r.attention else None)
            for b in range(beams[i]):
                self.rows[next(new_rows)] = _Row(job, Hypothesis([], []), start=T, alive=b == 0)
        return seconds

    def _fill(
        self, slots: list[int], keys: list[Cache], values: list[Cache], mask: np.ndarray, rows_of: np.ndarray
    ) -> list[int]:
        """Write new rows into holes, in place: no other row's cache is copied. Their old cache slots stay, masked."""
        tensors, ix = self.tensors, np.array(slots, np.int64)
        S, S_new = self.encoder_mask.shape[1], mask.shape[1]

        def put(cache: Cache, new: Cache) -> Cache:
            return tensors.put(cache, ix, tensors.pad(tensors.take(new, rows_of), 2, S - S_new))

        self.cross_keys = [put(c, k) for c, k in zip(self.cross_keys, keys, strict=True)]
        self.cross_values = [put(c, v) for c, v in zip(self.cross_values, values, strict=True)]
        self.encoder_mask[ix] = np.pad(mask[rows_of], ((0, 0), (0, S - S_new)))
        self.self_mask[ix] = 0  # the new rows own no cache slot yet
        return slots

    def _append(self, keys: list[Cache], values: list[Cache], mask: np.ndarray, rows_of: np.ndarray) -> list[int]:
        """Drop the holes, then add the new rows at the end (a copy of every cache)."""
        self._compact()
        tensors = self.tensors
        n, N, T = len(rows_of), len(self.rows), self.self_mask.shape[1]
        S_new = mask.shape[1]
        S = max(S_new, self.encoder_mask.shape[1])

        def join(old: Cache, new: Cache) -> Cache:  # old rows and the new rows (of enc), both padded to S
            old = tensors.pad(old, 2, S - tensors.shape(old)[2])
            return tensors.cat(old, tensors.pad(tensors.take(new, rows_of), 2, S - S_new))

        self.cross_keys = [join(a, b) for a, b in zip(self.cross_keys, keys, strict=True)]
        self.cross_values = [join(a, b) for a, b in zip(self.cross_values, values, strict=True)]
        S_old = self.encoder_mask.shape[1]
        self.encoder_mask = np.concatenate(
            [np.pad(self.encoder_mask, ((0, 0), (0, S - S_old))), np.pad(mask[rows_of], ((0, 0), (0, S - S_new)))]
        )
        self.past_keys = [tensors.pad(k, 0, n) for k in self.past_keys]  # the new rows own no slot yet
        self.past_values = [tensors.pad(v, 0, n) for v in self.past_values]
        self.self_mask = np.concatenate([self.self_mask, np.zeros((n, T), np.int64)], axis=0)
        self.rows.extend([None] * n)
        return list(range(N, N + n))

    def cancel(self, key: Hashable) -> None:
        """Drop the rows of a request whose caller went away."""
        self.rows = [None if r is not None and r.job.key == key else r for r in self.rows]
        self._tidy()

    def step(self) -> tuple[list[tuple[Hashable, DecodeResult]], float]:
        """One decoder call for every row; returns the requests that finished and the decoder seconds."""
        if not self.num_rows:
            return [], 0.0
        N = len(self.rows)
        start = self.spec.decoder_start_id
        last = [r.hyp.tokens[-1] if r is not None and r.hyp.tokens else start for r in self.rows]
        positions = [len(r.hyp.tokens) if r is not None else 0 for r in self.rows]
        self_mask = np.concatenate([self.self_mask, np.ones((N, 1), np.int64)], axis=1)
        t0 = time.perf_counter()
        out = self.runner.step(
            np.array(last, np.int64)[:, None],
            np.array(positions, np.int64)[:, None],
            self.encoder_mask,
            self_mask,
            self.cross_keys,
            self.cross_values,
            self.past_keys,
            self.past_values,
        )
        seconds = time.perf_counter() - t0
        self.past_keys, self.past_values, self.self_mask = out.present_keys, out.present_values, self_mask
        logits = out.logits.astype(np.float32, copy=False)  # float16 graphs would give float16
        logits[:, self.spec.pad_id] = -np.inf  # never emit padding
        scores = _Scores(logits)

        keep = list(range(N))  # the row whose cache each row continues (a beam's parent)
        new_rows = list(self.rows)
        done: list[tuple[Hashable, DecodeResult]] = []
        by_job: dict[int, list[int]] = {}
        for i, r in enumerate(self.rows):
            if r is not None:
                by_job.setdefault(id(r.job), []).append(i)
        for idx in by_job.values():
            job = self.rows[idx[0]].job  # type: ignore[union-attr]
            job.steps += 1
            children = self._advance(job, idx, scores, out) or []
            if not children:
                done.append((job.key, self._result(job)))
            for j, slot in enumerate(idx):  # a request's children take its own rows: masks and cross caches fit
                keep[slot], new_rows[slot] = children[j] if j < len(children) else (slot, None)
        if keep != list(range(N)):  # beams continue from other rows of their request: only the caches differ
            self.past_keys, self.past_values = self._take_rows(keep)
        self.rows = new_rows
        self._tidy()
        return done, seconds

    def _advance(self, job: _Job, idx: list[int], scores: _Scores, out: StepOutput) -> list[tuple[int, _Row]] | None:
        """Choose the next tokens of one request's rows; None when the request is finished."""
        req, eos = job.request, self.spec.eos_id
        rows = {i: r for i in idx if (r := self.rows[i]) is not None}
        start = rows[idx[0]].start
        t = job.steps  # tokens each row will have after this step

        def child(i: int, token: int) -> Hypothesis:
            r = rows[i]
            hyp = Hypothesis([*r.hyp.tokens, token], [*r.hyp.token_scores, scores.logp(i, token)])
            if req.attention:
                assert out.self_attentions is not None and out.cross_attentions is not None, "no attention outputs"
                s = len(req.src)
                hyp.self_attention = [*r.hyp.self_attention, out.self_attentions[:, i, :, r.start :].copy()]
                hyp.cross_attention = [*r.hyp.cross_attention, out.cross_attentions[:, i, :, :s].copy()]
            return hyp

        if req.forced is not None or req.beam_size == 1:
            i = idx[0]
            token = req.forced[t - 1] if req.forced is not None else int(scores.logits[i].argmax())
            hyp = child(i, token)
            limit = len(req.forced) if req.forced is not None else req.max_length
            if token == eos or t >= limit:
                job.finished.append(hyp)
                return None
            return [(i, _Row(job, hyp, start))]

        # Beam search: the best 2k continuations of the k live hypotheses; </s> ones finish.
        k = req.beam_size
        hyp_scores = np.array([rows[i].hyp.score if rows[i].alive else -np.inf for i in idx])
        children: list[tuple[int, _Row]] = []
        for rank, (parent, token) in enumerate(scores.beam_top(idx, hyp_scores, 2 * k)):
            if token == eos:
                if rank < k:
                    job.finished.append(child(parent, token))
                continue
            children.append((parent, _Row(job, child(parent, token), start)))
            if len(children) == k:
                break
        if len(job.finished) >= k or t >= req.max_length or not children:
            if t >= req.max_length:
                job.finished.extend(row.hyp for _, row in children)
            return None
        return children

    def _result(self, job: _Job) -> DecodeResult:
        lp = job.request.length_penalty
        ranked = sorted(job.finished, key=lambda h: -h.score / max(len(h.tokens), 1) ** lp)
        return DecodeResult(ranked[: max(job.request.n_best, 1)], job.encoder_attention)

    def _tidy(self) -> None:
        """After rows left: compact when holes are a quarter of the batch, then trim what no row needs."""
        live = [i for i, r in enumerate(self.rows) if r is not None]
        if not live:
            self.reset()
            return
        if (len(self.rows) - len(live)) * 4 >= len(self.rows):
            self._compact()
        self._trim()

    def _compact(self) -> None:
        """Copy the live rows out: no holes left."""
        keep = [i for i, r in enumerate(self.rows) if r is not None]
        if len(keep) == len(self.rows):
            return
        ix = np.array(keep, dtype=np.int64)
        self.past_keys, self.past_values = self._take_rows(keep)
        self.self_mask = self.self_mask[ix]
        self.cross_keys = [self.tensors.take(k, ix) for k in self.cross_keys]
        self.cross_values = [self.tensors.take(v, ix) for v in self.cross_values]
        self.encoder_mask = self.encoder_mask[ix]
        self.rows = [self.rows[i] for i in keep]

    def _take_rows(self, keep: list[int]) -> tuple[list[Cache], list[Cache]]:
        ix = np.array(keep, dtype=np.int64)
        take = self.tensors.take
        return [take(k, ix) for k in self.past_keys], [take(v, ix) for v in self.past_values]

    def _trim(self) -> None:
        """Drop cache slots no live row owns any more, and source columns no live row needs (only when it is worth
        a copy). A hole keeps at least one source column and gets a fresh self-attention slot every step."""
        rows = [i for i, r in enumerate(self.rows) if r is not None]
        live = [r for r in self.rows if r is not None]
        T = self.self_mask.shape[1]
        first = min(r.start for r in live)
        narrow = self.tensors.narrow
        if first > 0 and first * 4 >= T:
            self.past_keys = [narrow(k, 2, first, T) for k in self.past_keys]
            self.past_values = [narrow(v, 2, first, T) for v in self.past_values]
            self.self_mask = np.ascontiguousarray(self.self_mask[:, first:])
            for r in live:
                r.start -= first
        S = int(self.encoder_mask[rows].sum(axis=1).max())
        if self.encoder_mask.shape[1] * 3 >= S * 4:
            self.cross_keys = [narrow(k, 2, 0, S) for k in self.cross_keys]
            self.cross_values = [narrow(v, 2, 0, S) for v in self.cross_values]
            self.encoder_mask = np.ascontiguousarray(self.encoder_mask[:, :S])


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
