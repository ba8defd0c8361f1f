"""Caches gathered inside the step (the device decoder, decoder.device.onnx): past keys/values (P, h, T, d_k) in,
presents (N, h, T + 1, d_k) out, as appended caches grow, with three differences that keep work off the host:

- no self-attention mask goes to the graph: row r owns the last ``length[r]`` slots of the past caches and the new
  one (a row that joins owns none yet; trimming and aligning keep that true), which the graph reads off the
  position ids;
- a beam step's reordering is not copied: row r's past row (``parent``, the identity but after a beam step) goes to
  the next step as ``parent_rows``, and the graph gathers each row's caches from it; operations that take rows
  (compaction, a split) take them through ``parent``;
- the cross caches and the encoder mask hold one row per source (a beam request's rows share theirs), and each
  row's (``source``) goes to the graph as ``source_rows``; rows of sources no row reads any more are dropped when
  they are as many as the rest.
"""

from __future__ import annotations

import copy
from typing import Self

import numpy as np

from service.decoding.appended import AppendedCaches
from service.decoding.caches import CacheLayout
from service.decoding.encoding import Encoded
from service.decoding.rows import Rows
from service.decoding.step_runner import StepRunner
from service.runtime.runner import StepInput, StepOutput


class GatheredCaches(AppendedCaches):
    """Appended caches reordered and shared inside the step, on the runner's tensors."""

    def reset(self) -> None:
        """No rows."""
        super().reset()
        self.parent = np.zeros(0, np.int64)  # (N,) each row's past row
        self.source = np.zeros(0, np.int64)  # (N,) each row's cross row; -1 for a hole

    def run(self, runner: StepRunner, rows: Rows, tokens: np.ndarray) -> StepOutput:
        """The device decoder on every row (a hole reads any source), asked for 2k candidates a row when the
        widest beam is k (k = 2k exact: search.CandidateScores), one when every row is greedy."""
        widest = int(rows.width[rows.job >= 0].max())
        candidates = min(2 * widest if widest >= 2 else 1, self.spec.vocab_size)
        step = StepInput(
            rows.last[:, None], rows.length[:, None], self.encoder_mask, self.cross_keys, self.cross_values,
            self.past_keys, self.past_values, parent_rows=self.parent, source_rows=np.maximum(self.source, 0),
            candidates=candidates,
        )  # fmt: skip
        return runner.step(step)

    def store(self, out: StepOutput) -> None:
        """A step's presents become the caches, one slot longer, row by row."""
        super().store(out)
        self.parent = np.arange(len(self.parent))

    def move(self, dst: np.ndarray, src: np.ndarray, rows: Rows) -> None:
        """Rows ``dst`` continue rows ``src``: the next step gathers their past caches."""
        self.parent[dst] = self.parent[src]

    def grow(self, rows: Rows, m: int) -> None:
        """m empty rows at the end (no source yet)."""
        P = self.tensors.shape(self.past_keys[0])[0]
        self.past_keys = [self.tensors.pad(k, 0, m) for k in self.past_keys]
        self.past_values = [self.tensors.pad(v, 0, m) for v in self.past_values]
        self.self_mask = np.concatenate([self.self_mask, np.zeros((m, self.self_mask.shape[1]), np.int64)])
        self.parent = np.concatenate([self.parent, P + np.arange(m)])
        self.source = np.concatenate([self.source, np.full(m, -1, np.int64)])

    def fill(self, ix: np.ndarray, enc: Encoded, which: np.ndarray, mask: np.ndarray) -> None:
        """New rows ``ix`` (of requests ``which`` of ``enc``, one each; a beam request's rows share one) read new
        cross rows, one per request, appended; they own no cache slot yet."""
        tensors = self.tensors
        _, first, index = np.unique(which, return_index=True, return_inverse=True)
        keys, values = enc.cross(which[first])
        S, S_new = self.width, tensors.shape(keys[0])[2]
        if S_new > S:
            self.cross_keys = [tensors.pad(k, 2, S_new - S) for k in self.cross_keys]
            self.cross_values = [tensors.pad(v, 2, S_new - S) for v in self.cross_values]
        elif S_new < S:
            keys = [tensors.pad(k, 2, S - S_new) for k in keys]
            values = [tensors.pad(v, 2, S - S_new) for v in values]
        J, width = len(self.encoder_mask), max(S, S_new)
        if J:
            keys = [tensors.cat(c, k) for c, k in zip(self.cross_keys, keys, strict=True)]
            values = [tensors.cat(c, v) for c, v in zip(self.cross_values, values, strict=True)]
        self.cross_keys, self.cross_values = keys, values
        joined = np.zeros((len(first), width), np.int64)
        joined[:, : mask.shape[1]] = mask[first]
        self.encoder_mask = np.concatenate([np.pad(self.encoder_mask, ((0, 0), (0, width - S))), joined])
        self.source[ix] = J + index
        self.self_mask[ix] = 0

    def leave(self, ix: np.ndarray) -> None:
        """Rows ``ix`` become holes, reading no source."""
        super().leave(ix)
        self.source[ix] = -1

    def compact(self, rows: Rows, live: np.ndarray, n: int) -> Rows:
        """The live rows (n of them) copied out, in order, with their past rows and sources; no other source."""
        ix, take = np.flatnonzero(live), self.tensors.take
        self.past_keys = [take(k, self.parent[ix]) for k in self.past_keys]
        self.past_values = [take(v, self.parent[ix]) for v in self.past_values]
        self.self_mask, self.source, self.parent = self.self_mask[ix], self.source[ix], np.arange(n)
        self._drop_sources(every=True)
        return rows.take(ix)

    def trim_sources(self, live: np.ndarray) -> None:
        """Drop the sources no row reads (when they are as many as the rest), then source columns no live row needs
        (only when it is worth a copy)."""
        self._drop_sources(every=False)
        S = int(self.encoder_mask[self.source[live]].sum(axis=1).max())
        if self.encoder_mask.shape[1] * 3 >= S * 4:
            narrow = self.tensors.narrow
            self.cross_keys = [narrow(k, 2, 0, S) for k in self.cross_keys]
            self.cross_values = [narrow(v, 2, 0, S) for v in self.cross_values]
            self.encoder_mask = np.ascontiguousarray(self.encoder_mask[:, :S])

    def _drop_sources(self, every: bool) -> None:
        """Keep only the sources some row reads: ``every`` time there is one to drop, or when they are at most
        half."""
        read = np.unique(self.source[self.source >= 0])
        J = len(self.encoder_mask)
        if len(read) == J or (not every and 2 * len(read) > J):
            return
        take = self.tensors.take
        self.cross_keys = [take(k, read) for k in self.cross_keys]
        self.cross_values = [take(v, read) for v in self.cross_values]
        self.encoder_mask = self.encoder_mask[read]
        self.source = np.where(self.source >= 0, np.searchsorted(read, self.source), -1)

    def split(self, ix: np.ndarray, first: int) -> Self:
        """New caches of rows ``ix`` (live), with their past rows from slot ``first`` on, and their sources cut to the
        columns they use."""
        other = copy.copy(self)
        T, take, narrow = self.slots, self.tensors.take, self.tensors.narrow
        read = np.unique(self.source[ix])
        S = int(self.encoder_mask[read].sum(axis=1).max())
        other.past_keys = [narrow(take(k, self.parent[ix]), 2, first, T) for k in self.past_keys]
        other.past_values = [narrow(take(v, self.parent[ix]), 2, first, T) for v in self.past_values]
        other.cross_keys = [narrow(take(k, read), 2, 0, S) for k in self.cross_keys]
        other.cross_values = [narrow(take(v, read), 2, 0, S) for v in self.cross_values]
        other.self_mask = np.ascontiguousarray(self.self_mask[ix, first:])
        other.encoder_mask = np.ascontiguousarray(self.encoder_mask[read, :S])
        other.source, other.parent = np.searchsorted(read, self.source[ix]), np.arange(len(ix))
        return other

    def join(self, other: CacheLayout) -> None:
        """Append the rows of ``other`` (aligned), their past rows and sources after this one's."""
        assert isinstance(other, GatheredCaches)
        P, J = self.tensors.shape(self.past_keys[0])[0], len(self.encoder_mask)
        super().join(other)
        self.parent = np.concatenate([self.parent, P + other.parent])
        self.source = np.concatenate([self.source, np.where(other.source >= 0, J + other.source, -1)])
