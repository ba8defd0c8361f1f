"""Appended caches (decoder.onnx, float16): past keys/values (N, h, T, d_k) in, presents (N, h, T + 1, d_k) out,
row r owning slots ``start[r]:T`` under a self-attention mask (N, T); a row that joins late owns only the slots from
its start on, so a row's answer does not depend on its neighbours."""

from __future__ import annotations

import numpy as np

from service.decoding.caches import Caches
from service.decoding.rows import Rows
from service.decoding.step_runner import StepRunner
from service.runtime.runner import StepInput, StepOutput
from service.runtime.tensors import Cache


class AppendedCaches(Caches):
    """Caches that grow by one slot a step, on the host or the device."""

    def prepare(self, rows: Rows) -> int:
        """This step's self-attention mask: every row owns the new slot."""
        self._step_mask = np.concatenate([self.self_mask, np.ones((len(rows), 1), np.int64)], axis=1)
        return int(self._step_mask.shape[1])

    def store(self, out: StepOutput) -> None:
        """A step's presents become the caches, one slot longer, and its mask the batch's."""
        self.past_keys, self.past_values = out.present_keys, out.present_values
        self.self_mask = self._step_mask

    def run(self, runner: StepRunner, rows: Rows, tokens: np.ndarray) -> StepOutput:
        """The decoder on every row; on a batch with no cache yet, only on the rows that hold a hypothesis (a beam
        request's other rows start empty): beam k computes one row a request in its first step, not k."""
        ids, positions, self_mask = rows.last[:, None], rows.length[:, None], self._step_mask
        if self.self_mask.shape[1] or rows.alive.all():
            caches = (self.cross_keys, self.cross_values, self.past_keys, self.past_values)
            return runner.step(StepInput(ids, positions, self.encoder_mask, *caches, self_attention_mask=self_mask))
        run, tensors = np.flatnonzero(rows.alive), self.tensors
        cross_keys, cross_values, past_keys, past_values = (
            [tensors.take(c, run) for c in caches]
            for caches in (self.cross_keys, self.cross_values, self.past_keys, self.past_values)
        )
        out = runner.step(
            StepInput(ids[run], positions[run], self.encoder_mask[run], cross_keys, cross_values, past_keys,
                      past_values, self_attention_mask=self_mask[run])
        )  # fmt: skip
        self_attention, cross_attention = (None if a is None else self._spread(a, run, len(rows), 1) for a in
                                           (out.self_attentions, out.cross_attentions))  # fmt: skip
        return StepOutput(
            self._spread(out.logits, run, len(rows)),  # an empty row is no hypothesis: its logits are never ranked
            [self._spread(k, run, len(rows)) for k in out.present_keys],
            [self._spread(v, run, len(rows)) for v in out.present_values],
            self_attention,
            cross_attention,
        )

    def _spread(self, x: np.ndarray | Cache, run: np.ndarray, N: int, axis: int = 0) -> np.ndarray | Cache:
        """Rows ``run`` of N; the others zeros."""
        if not isinstance(x, np.ndarray):  # a device cache
            tensors = self.tensors
            shape = tensors.shape(x)
            return tensors.put(tensors.pad(tensors.empty((0, *shape[1:])), 0, N), run, x)
        full = np.zeros((*x.shape[:axis], N, *x.shape[axis + 1 :]), x.dtype)
        full[(slice(None),) * axis + (run,)] = x
        return full

    def trim(self, rows: Rows, live: np.ndarray) -> None:
        """Drop cache slots no live row owns any more (when they are a quarter of them), then source columns."""
        T, first = self.self_mask.shape[1], int(rows.start[live].min())
        if first > 0 and first * 4 >= T:
            narrow = self.tensors.narrow
            self.past_keys = [narrow(k, 2, first, T) for k in self.past_keys]
            self.past_values = [narrow(v, 2, first, T) for v in self.past_values]
            self.self_mask = np.ascontiguousarray(self.self_mask[:, first:])
            rows.start = np.maximum(rows.start - first, 0)
        self.trim_sources(live)
