"""A batch's key/value caches, behind one interface (:class:`CacheLayout`) with one implementation a layout, chosen
once when the decoder is built (:func:`service.decoding.decoder.layout_of`):

- :class:`~service.decoding.appended.AppendedCaches`: past caches (N, h, T, d_k) in, presents one slot longer
  out, row r owning slots ``start[r]:T`` under a self-attention mask (decoder.onnx, float16);
- :class:`~service.decoding.in_place.DeviceInPlaceCaches`: row r's tokens at slots ``0:length[r]`` of buffers
  (N, h, C, d_k) that the decoder writes in place, no mask, capacity C following the longest row (the fast graphs
  on device values, IOBinding);
- :class:`~service.decoding.in_place.HostInPlaceCaches`: the same in numpy buffers with room for more rows, whose
  cross caches may serve a beam request's G rows from one source row.

Cross keys/values are (N / G, h, S, d_k) with an encoder mask (N / G, S) in every layout. :class:`Caches` holds
what the layouts share: the arrays, and their operations through the runner's tensors.
"""

from __future__ import annotations

import copy
from typing import Protocol, Self

import numpy as np

from service.decoding.encoding import Encoded
from service.decoding.rows import Rows
from service.decoding.step_runner import StepRunner
from service.runtime.bundle import ModelSpec
from service.runtime.runner import StepOutput
from service.runtime.tensors import Cache, Tensors


class CacheLayout(Protocol):
    """What a batch asks of its caches (rows are the batch's :class:`~service.decoding.rows.Rows`, entry r for
    cache row r)."""

    group: int  # G: rows a source's cross keys and values serve

    @property
    def slots(self) -> int: ...  # T: the self-attention mask's length (0 when caches are written in place)
    @property
    def width(self) -> int: ...  # S: the padded source length
    def fresh(self) -> CacheLayout: ...  # empty caches of the same layout
    def regroup(self, width: np.ndarray, empty: bool) -> None: ...  # before rows of beam ``width`` join
    def grow(self, rows: Rows, m: int) -> None: ...  # m empty rows at the end (before ``rows`` extends)
    def fill(self, ix: np.ndarray, enc: Encoded, which: np.ndarray, mask: np.ndarray) -> None: ...
    def leave(self, ix: np.ndarray) -> None: ...  # rows ix become holes
    def prepare(self, rows: Rows) -> int: ...  # before a step: the cache slots a row may own after it
    # the decoder on every row; ``tokens``: the rows whose greedy token a greedy-tokens graph may give (Plan.tokens)
    def run(self, runner: StepRunner, rows: Rows, tokens: np.ndarray) -> StepOutput: ...
    def store(self, out: StepOutput) -> None: ...  # after a step: its presents become the caches
    def move(self, dst: np.ndarray, src: np.ndarray, rows: Rows) -> None: ...  # beam rows continue others'
    def compact(self, rows: Rows, live: np.ndarray, n: int) -> Rows: ...  # no holes left; the rows kept
    def trim(self, rows: Rows, live: np.ndarray) -> None: ...  # drop slots and source columns no live row needs
    def split(self, ix: np.ndarray, first: int) -> CacheLayout: ...  # rows ix, from slot ``first`` on
    def align(self, T: int, S: int) -> int: ...  # pad to T slots (in front) and S columns; the slots added
    def join(self, other: CacheLayout) -> None: ...  # append other's rows (aligned)


class Caches:
    """The arrays every layout holds, and the operations that are the same in each (through the runner's tensors).

    Args:
        tensors: the runner's kind of array.
        spec: the model (layers, heads, d_k).
    """

    def __init__(self, tensors: Tensors, spec: ModelSpec) -> None:
        self.tensors = tensors
        self.spec = spec
        self.reset()

    def reset(self) -> None:
        """No rows."""
        L, h, d_k = self.spec.n_decoder_layers, self.spec.h, self.spec.d_k
        empty = self.tensors.empty((0, h, 0, d_k))
        self.past_keys: list[Cache] = [empty] * L
        self.past_values: list[Cache] = [empty] * L
        self.self_mask = np.zeros((0, 0), np.int64)  # (N, T)
        self.cross_keys: list[Cache] = [empty] * L
        self.cross_values: list[Cache] = [empty] * L
        self.encoder_mask = np.zeros((0, 0), np.int64)  # (N / G, S)
        self.group = 1  # G: rows a source's cross keys and values serve (cross caches (N / G, h, S, d_k))

    def fresh(self) -> Self:
        """Empty caches of this layout."""
        caches = copy.copy(self)
        caches.reset()
        return caches

    @property
    def slots(self) -> int:
        """T: the cache length."""
        return int(self.self_mask.shape[1])

    @property
    def width(self) -> int:
        """S: the padded source length."""
        return int(self.encoder_mask.shape[1])

    def regroup(self, width: np.ndarray, empty: bool) -> None:
        """One source row a row: nothing to regroup."""

    def sources(self, rows: np.ndarray) -> np.ndarray:
        """The cross caches' rows of batch rows ``rows`` (whole groups, in order, when grouped)."""
        return rows[:: self.group] // self.group

    def grow(self, rows: Rows, m: int) -> None:
        """Add m empty rows at the end (a copy of every cache), for newcomers that the holes cannot take."""
        N, sources = len(rows), m // self.group
        self.cross_keys = [self.grown(k, sources) for k in self.cross_keys]
        self.cross_values = [self.grown(v, sources) for v in self.cross_values]
        self.encoder_mask = np.pad(self.encoder_mask, ((0, sources), (0, 0)))
        self.past_keys = [self.moved(k, rows.length, rows=N + m) for k in self.past_keys]
        self.past_values = [self.moved(v, rows.length, rows=N + m) for v in self.past_values]
        self.self_mask = np.concatenate([self.self_mask, np.zeros((m, self.self_mask.shape[1]), np.int64)])

    def grown(self, cache: Cache, m: int) -> Cache:
        """A cross-attention cache with m more rows, for newcomers to write."""
        return self.tensors.pad(cache, 0, m)

    def moved(
        self, cache: Cache, lengths: np.ndarray, rows: np.ndarray | int | None = None, capacity: int | None = None
    ) -> Cache:
        """A self-attention cache with rows ``rows`` (an index: those rows; a count: every row, then empty ones up
        to that many) and ``capacity`` slots; ``lengths``: the tokens each row holds."""
        tensors = self.tensors
        C = tensors.shape(cache)[2]
        capacity = C if capacity is None else capacity
        if isinstance(rows, int):
            cache = tensors.pad(cache, 0, rows - tensors.shape(cache)[0])
        elif rows is not None:
            cache = tensors.take(cache, rows)
        if capacity < C:
            return tensors.narrow(cache, 2, 0, capacity)
        return cache if capacity == C else tensors.pad(cache, 2, capacity - C)

    def fill(self, ix: np.ndarray, enc: Encoded, which: np.ndarray, mask: np.ndarray) -> None:
        """Write new rows ``ix`` (the cross keys and values of requests ``which`` of ``enc``, and their encoder
        mask) into holes, in place: no other row's self-attention cache is copied (the cross caches are, once, when
        a new source is longer than S). Their old cache slots stay, masked."""
        tensors, at = self.tensors, self.sources(ix)
        S, S_new = self.encoder_mask.shape[1], mask.shape[1]
        fresh = S == 0 and len(at) == len(self.encoder_mask)  # an empty batch: every row is a newcomer's
        if fresh and (adopted := enc.adopt(which)) is not None:  # their caches become its own
            self.cross_keys, self.cross_values = adopted
            self.encoder_mask = mask
        elif S_new > S:
            self.cross_keys = [tensors.pad(k, 2, S_new - S) for k in self.cross_keys]
            self.cross_values = [tensors.pad(v, 2, S_new - S) for v in self.cross_values]
            self.encoder_mask = np.pad(self.encoder_mask, ((0, 0), (0, S_new - S)))
        if self.encoder_mask is not mask:
            self.cross_keys, self.cross_values = enc.write(self.cross_keys, self.cross_values, at, which)
            self.encoder_mask[at] = 0
            self.encoder_mask[at, :S_new] = mask
        self.self_mask[ix] = 0  # the new rows own no cache slot yet

    def leave(self, ix: np.ndarray) -> None:
        """Rows ``ix`` become holes; a hole attends to nothing but its newest slot."""
        self.self_mask[ix] = 0

    def store(self, out: StepOutput) -> None:
        """A step's presents become the caches."""
        self.past_keys, self.past_values = out.present_keys, out.present_values

    def move(self, dst: np.ndarray, src: np.ndarray, rows: Rows) -> None:
        """Rows ``dst``'s self-attention caches become copies of rows ``src``'s."""
        put, take = self.tensors.put, self.tensors.take
        self.past_keys = [put(k, dst, take(k, src)) for k in self.past_keys]
        self.past_values = [put(v, dst, take(v, src)) for v in self.past_values]

    def compact(self, rows: Rows, live: np.ndarray, n: int) -> Rows:
        """The live rows (n of them, mask ``live``) copied out, in order; returns them."""
        ix, take = np.flatnonzero(live), self.tensors.take
        self.past_keys = [self.moved(k, rows.length, ix) for k in self.past_keys]
        self.past_values = [self.moved(v, rows.length, ix) for v in self.past_values]
        self.self_mask = self.self_mask[ix]
        self.cross_keys = [take(k, ix) for k in self.cross_keys]
        self.cross_values = [take(v, ix) for v in self.cross_values]
        self.encoder_mask = self.encoder_mask[ix]
        return rows.take(ix)

    def trim_sources(self, live: np.ndarray) -> None:
        """Drop source columns no live row needs (only when it is worth a copy); a hole keeps at least one."""
        S = int(self.encoder_mask[live // self.group].sum(axis=1).max())
        if self.encoder_mask.shape[1] * 3 >= S * 4:
            narrow = self.tensors.narrow
            self.cross_keys = [narrow(k, 2, 0, S) for k in self.cross_keys]
            self.cross_values = [narrow(v, 2, 0, S) for v in self.cross_values]
            self.encoder_mask = np.ascontiguousarray(self.encoder_mask[:, :S])

    def split(self, ix: np.ndarray, first: int) -> Self:
        """New caches of rows ``ix``, keeping only the cache slots (from ``first`` on) and source columns they use."""
        other = copy.copy(self)
        T, S = self.slots, int(self.encoder_mask[ix].sum(axis=1).max())
        take, narrow = self.tensors.take, self.tensors.narrow
        other.past_keys = [narrow(take(k, ix), 2, first, T) for k in self.past_keys]
        other.past_values = [narrow(take(v, ix), 2, first, T) for v in self.past_values]
        other.cross_keys = [narrow(take(k, ix), 2, 0, S) for k in self.cross_keys]
        other.cross_values = [narrow(take(v, ix), 2, 0, S) for v in self.cross_values]
        other.self_mask = np.ascontiguousarray(self.self_mask[ix, first:])
        other.encoder_mask = np.ascontiguousarray(self.encoder_mask[ix, :S])
        return other

    def align(self, T: int, S: int) -> int:
        """Pad to T cache slots (masked, in front: a row owns the last slots of its cache) and S source columns;
        returns the slots added in front."""
        tensors, front, wider = self.tensors, T - self.slots, S - self.width
        self.past_keys = [tensors.pad(k, 2, front, front=True) for k in self.past_keys]
        self.past_values = [tensors.pad(v, 2, front, front=True) for v in self.past_values]
        self.self_mask = np.pad(self.self_mask, ((0, 0), (front, 0)))
        self.cross_keys = [tensors.pad(k, 2, wider) for k in self.cross_keys]
        self.cross_values = [tensors.pad(v, 2, wider) for v in self.cross_values]
        self.encoder_mask = np.pad(self.encoder_mask, ((0, 0), (0, wider)))
        return front

    def join(self, other: CacheLayout) -> None:
        """Append the rows of ``other`` (aligned: :meth:`align`), caches of this same layout."""
        assert isinstance(other, Caches)
        cat = self.tensors.cat

        def join(mine: list[Cache], theirs: list[Cache]) -> list[Cache]:
            return [cat(x, y) for x, y in zip(mine, theirs, strict=True)]

        self.past_keys, self.past_values = (
            join(self.past_keys, other.past_keys),
            join(self.past_values, other.past_values),
        )
        self.cross_keys = join(self.cross_keys, other.cross_keys)
        self.cross_values = join(self.cross_values, other.cross_values)
        self.self_mask = np.concatenate([self.self_mask, other.self_mask])
        self.encoder_mask = np.concatenate([self.encoder_mask, other.encoder_mask])
