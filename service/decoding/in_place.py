"""Caches written in place (decoder.fast.onnx, the int8 graphs): row r's tokens sit at slots ``0:length[r]`` of
buffers (N, h, C, d_k) that each step writes its slot into; no self-attention mask (T = 0), so a row attends over
its own tokens only, whatever its neighbours' lengths. The capacity C follows the longest row.

:class:`DeviceInPlaceCaches` keeps them as device values (IOBinding); :class:`HostInPlaceCaches` as numpy buffers
with room for more rows, and lets a beam request's G rows share one source row of the cross caches.
"""

from __future__ import annotations

import time

import numpy as np

from service.decoding.caches import Caches
from service.decoding.greedy_choice import GreedyChoice
from service.decoding.rows import Rows
from service.decoding.step_runner import StepRunner
from service.runtime import _beam
from service.runtime.bundle import ModelSpec
from service.runtime.runner import StepInput, StepOutput
from service.runtime.tensors import Cache, Tensors


class DeviceInPlaceCaches(Caches):
    """Buffers written in place, through the runner's tensors.

    Args:
        tensors: the runner's kind of array.
        spec: the model.
        greedy_tokens: the graph gives greedy tokens instead of logits where asked.
    """

    def __init__(self, tensors: Tensors, spec: ModelSpec, greedy_tokens: bool) -> None:
        super().__init__(tensors, spec)
        self.greedy_tokens = greedy_tokens
        self.choice = GreedyChoice()

    def prepare(self, rows: Rows) -> int:
        """Room for one more token in the longest row (the buffers grow, doubling); their capacity."""
        slots, capacity = int(rows.length.max()) + 1, self.tensors.shape(self.past_keys[0])[2]
        if slots > capacity:
            capacity = max(slots, 2 * capacity, 16)
            self.past_keys = [self.moved(k, rows.length, capacity=capacity) for k in self.past_keys]
            self.past_values = [self.moved(v, rows.length, capacity=capacity) for v in self.past_values]
        return int(capacity)

    def run(self, runner: StepRunner, rows: Rows, tokens: np.ndarray) -> StepOutput:
        """The decoder on every row: rows ``tokens`` (greedy and unscored) take the graph's greedy tokens where
        :class:`GreedyChoice` finds them the cheaper, the others their logits."""
        caches = (self.cross_keys, self.cross_values, self.past_keys, self.past_values)
        chosen = self.greedy_tokens and len(tokens) > 0
        asked = chosen and self.choice.tokens(len(tokens))
        started = time.thread_time()  # this thread's CPU: a step preempted by the event loop costs no more
        step = StepInput(
            rows.last[:, None], rows.length[:, None], self.encoder_mask, *caches, token_rows=tokens if asked else None
        )
        out = runner.step(step)
        if chosen and len(tokens) == len(rows.last):  # a step whose every row may take tokens: the modes compare
            self.choice.record(asked, time.thread_time() - started, len(rows.last))
        return out

    def trim(self, rows: Rows, live: np.ndarray) -> None:
        """Buffers 4 times what the longest row needs (and 64 slots or more) are cut to twice that; then source
        columns no live row needs."""
        keep = 2 * max(int(rows.length[live].max()) + 1, 16)
        if self.tensors.shape(self.past_keys[0])[2] >= 2 * keep:
            self.past_keys = [self.moved(k, rows.length, capacity=keep) for k in self.past_keys]
            self.past_values = [self.moved(v, rows.length, capacity=keep) for v in self.past_values]
        self.trim_sources(live)


class HostInPlaceCaches(DeviceInPlaceCaches):
    """Numpy buffers written in place, the first rows of arrays with room for more.

    While every row is a beam row of one width G (and the graph takes grouped cross rows), the cross caches and
    the encoder mask hold one source a request, for rows gG .. gG + G - 1 (a request's rows, from admission to
    leaving; holes come in whole groups too), and cross-attention runs one query group a source; the first other
    row to join ungroups them (a copy of the cross caches, once).

    Args:
        tensors: the runner's (host) tensors.
        spec: the model.
        greedy_tokens: the graph gives greedy tokens instead of logits where asked.
        grouped: the graph's cross keys and values may serve G consecutive rows each.
    """

    def __init__(self, tensors: Tensors, spec: ModelSpec, greedy_tokens: bool, grouped: bool) -> None:
        super().__init__(tensors, spec, greedy_tokens)
        self.grouped = grouped

    def regroup(self, width: np.ndarray, empty: bool) -> None:
        """Before rows of beam ``width`` join: group the cross caches by a beam width when the batch is empty and
        every newcomer is a beam row of that width; ungroup them when a newcomer is not."""
        k = int(width[0])
        if empty:
            self.group = k if self.grouped and k >= 2 and bool((width == k).all()) else 1
        elif self.group > 1 and not (width == self.group).all():
            G, self.group = self.group, 1
            self.cross_keys = [np.repeat(c, G, axis=0) for c in self.cross_keys]
            self.cross_values = [np.repeat(c, G, axis=0) for c in self.cross_values]
            self.encoder_mask = np.repeat(self.encoder_mask, G, axis=0)

    def grown(self, cache: Cache, m: int) -> Cache:
        """The rows after ``cache`` in the array that it is the first rows of, while there is room (no copy), else
        a new array with room for twice the rows (as :meth:`moved`)."""
        N, whole = len(cache), _whole(cache)
        if N + m <= len(whole):
            return whole[: N + m]
        out = np.empty((max(N + m, 2 * N), *cache.shape[1:]), cache.dtype)
        out[:N] = cache
        return out[: N + m]

    def moved(
        self, cache: Cache, lengths: np.ndarray, rows: np.ndarray | int | None = None, capacity: int | None = None
    ) -> Cache:
        """Rows that join take the rows after the buffers while there is room (no copy: a new row's slots are
        written before they are read), and a new array gets room for twice the rows. Into a new array, only the
        slots that each row holds tokens in (``lengths``) are copied, and the rest are left as they come (the fast
        decoder reads a row's slots below its length only, tests/model/export/test_build.py): one long row makes the
        buffers many times what the others use."""
        N, h, C, d_k = cache.shape
        capacity = C if capacity is None else capacity
        assert not isinstance(rows, np.ndarray), "host buffers are compacted in place (compact)"
        size, whole = N if rows is None else rows, _whole(cache)
        if capacity == C and size <= len(whole):
            return whole[:size]
        room = max(size, 2 * N) if size > N else len(whole)  # rows that join: room for twice the rows
        out = np.empty((room, h, capacity, d_k), cache.dtype)
        every = np.arange(N)
        _beam.copy_rows(out, every, cache, every, lengths)
        return out[:size]

    def run(self, runner: StepRunner, rows: Rows, tokens: np.ndarray) -> StepOutput:
        """The decoder on every row; while no row holds a token, only on the rows that hold a hypothesis
        (:meth:`_first_step`)."""
        if not rows.alive.all() and not rows.length.any():
            return self._first_step(runner, rows)
        return super().run(runner, rows, tokens)

    def _first_step(self, runner: StepRunner, rows: Rows) -> StepOutput:
        """The rows that hold a hypothesis step on buffers of their own, whose first slot is then copied into the
        batch's: a batch of beam-k requests computes one row a request in its first step, not k."""
        run = np.flatnonzero(rows.alive)
        at = run // self.group  # their sources
        if np.array_equal(at, np.arange(len(self.encoder_mask))):
            cross_keys, cross_values, encoder_mask = self.cross_keys, self.cross_values, self.encoder_mask
        else:
            cross_keys, cross_values = [c[at] for c in self.cross_keys], [c[at] for c in self.cross_values]
            encoder_mask = self.encoder_mask[at]
        past_keys, past_values = ([np.empty((len(run), *c.shape[1:]), c.dtype) for c in caches]
                                  for caches in (self.past_keys, self.past_values))  # fmt: skip
        ids, positions = rows.last[run, None], rows.length[run, None]
        out = runner.step(StepInput(ids, positions, encoder_mask, cross_keys, cross_values, past_keys, past_values))
        for full, mine in zip((*self.past_keys, *self.past_values), (*past_keys, *past_values), strict=True):
            full[run, :, :1] = mine[:, :, :1]
        logits = np.zeros((len(rows), out.logits.shape[1]), out.logits.dtype)
        logits[run] = out.logits  # an empty row is no hypothesis: its (finite) logits are never ranked
        return StepOutput(logits, self.past_keys, self.past_values, None, None)

    def move(self, dst: np.ndarray, src: np.ndarray, rows: Rows) -> None:
        """Only the slots the rows hold tokens in (this step's is written, not counted), in place."""
        self._copy_slots(dst, src, rows.length[dst] + 1)

    def _copy_slots(self, dst: np.ndarray, src: np.ndarray, used: np.ndarray) -> None:
        """Rows ``src``'s first ``used`` (one count a row) self-attention cache slots into rows ``dst``, in place."""
        dst, src = np.ascontiguousarray(dst, np.int64), np.ascontiguousarray(src, np.int64)
        for cache in (*self.past_keys, *self.past_values):
            _beam.copy_rows(cache, dst, cache, src, used)

    def compact(self, rows: Rows, live: np.ndarray, n: int) -> Rows:
        """The live rows past the first n move into the holes among the first n and every array keeps its first n
        rows, a view: only the moved rows are copied (their used slots)."""
        src, dst = np.flatnonzero(live[n:]) + n, np.flatnonzero(~live[:n])  # whole groups, in order, when grouped
        self._copy_slots(dst, src, rows.length[src])
        to, of = self.sources(dst), self.sources(src)
        whole = np.full(len(to), self.width, np.int64)
        for cache in (*self.cross_keys, *self.cross_values):  # whole rows (the batch's own, C-contiguous)
            _beam.copy_rows(cache, to, cache, of, whole)
        self.encoder_mask[to] = self.encoder_mask[of]
        rows.move(dst, src)
        self.past_keys, self.past_values = [k[:n] for k in self.past_keys], [v[:n] for v in self.past_values]
        J = n // self.group
        self.cross_keys, self.cross_values = [k[:J] for k in self.cross_keys], [v[:J] for v in self.cross_values]
        self.encoder_mask, self.self_mask = self.encoder_mask[:J], self.self_mask[:n]
        return rows.head(n)


def _whole(cache: np.ndarray) -> np.ndarray:
    """The array that ``cache`` is the first rows of (a view of), or ``cache``."""
    base = cache.base
    if not isinstance(base, np.ndarray) or not (base.flags.c_contiguous and cache.flags.c_contiguous):
        return cache
    return base if base.shape[1:] == cache.shape[1:] and base.ctypes.data == cache.ctypes.data else cache
