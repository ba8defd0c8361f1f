"""Encoding: requests' sources in one encoder call (:func:`encode`), held (:class:`Encoded`) until they join a
batch. On the host the sources are packed (:func:`pack`): several texts share an encoder row and nobody's padding is
encoded (:class:`HostEncoded`); device caches (IOBinding) stay one text a row (:class:`Encoded`): gathering
texts out of rows would need graphs of their own."""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from service.decoding.request import DecodeRequest
from service.decoding.step_runner import StepRunner
from service.runtime import _beam
from service.runtime.tensors import Cache, Tensors

# Encoder row lengths that texts may be packed into (a longer text gets a row of its own length): a few short texts
# fill one wide row with little padding, many fill narrow rows evenly; wider rows would add the attention's quadratic
# cost, which the token count below leaves out.
PACK_WIDTHS = (32, 64, 96)


def pack(lengths: np.ndarray, widths: tuple[int, ...] = PACK_WIDTHS) -> tuple[np.ndarray, np.ndarray]:
    """Place texts of ``lengths`` in encoder rows: for each of ``widths``, one after another in rows of ``max(width,
    longest)`` tokens, longest first, each into the first row with room (first-fit decreasing); or one text a row.
    The layout that encodes the fewest tokens wins (rows × the fullest row's tokens), one text a row on a tie
    (texts of about one length), else the narrowest. Returns each text's row and start in it.

    The encoder's cost follows rows × row length (the longest text's, when padded), and one call's fixed cost is
    paid once. Texts in one row do not see each other (the encoder's segment mask), so packing changes no answer.
    """
    sizes: list[int] = lengths.tolist()
    longest = max(sizes)
    order = sorted(range(len(sizes)), key=sizes.__getitem__, reverse=True)  # longest first, ties in order
    best, fewest = (list(range(len(sizes))), [0] * len(sizes)), len(sizes) * longest  # one text a row
    for width in widths:
        row, start, tokens = _first_fit(sizes, order, max(width, longest))
        if tokens < fewest:
            best, fewest = (row, start), tokens
    return np.array(best[0]), np.array(best[1])


def _first_fit(sizes: list[int], order: list[int], width: int) -> tuple[list[int], list[int], int]:
    """Texts in ``order`` each into the first row of ``width`` with room: each text's row and start, and the
    tokens encoded."""
    row, start = [0] * len(sizes), [0] * len(sizes)
    used: list[int] = []  # tokens taken in each row
    for i in order:
        size = sizes[i]
        r = next((r for r, u in enumerate(used) if u + size <= width), len(used))
        if r == len(used):
            used.append(0)
        row[i], start[i] = r, used[r]
        used[r] += size
    return row, start, len(used) * max(used)


@dataclass
class Encoded:
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

    @staticmethod
    def place(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each text's encoder row and start in it: one text a row."""
        return np.arange(len(lengths)), 0 * lengths

    def cross(self, ix: np.ndarray) -> tuple[list[Cache], list[Cache]]:
        """Cross keys and values (n, h, S, d_k) of requests ``ix`` (one may repeat: a beam request's rows), S the
        longest of their sources; slots past a source's end are masked out. One copy, or none when they are the
        encoder's rows as they are."""
        S, W = int(self.lengths[ix].max()), int(self.tensors.shape(self.cross_keys[0])[2])
        if S == W and np.array_equal(ix, np.arange(len(self.keys))) and np.array_equal(self.row, ix):
            return self.cross_keys, self.cross_values
        return self._gather(ix, S)

    def _gather(self, ix: np.ndarray, S: int) -> tuple[list[Cache], list[Cache]]:
        take, narrow = self.tensors.take, self.tensors.narrow
        keys, values = (
            [narrow(take(c, ix), 2, 0, S) for c in layers] for layers in (self.cross_keys, self.cross_values)
        )
        return keys, values

    def adopt(self, ix: np.ndarray) -> tuple[list[Cache], list[Cache]] | None:
        """Cross caches for an empty batch of requests ``ix`` to own; None: it writes them (:meth:`write`)."""
        return None

    def write(
        self, cross_keys: list[Cache], cross_values: list[Cache], at: np.ndarray, ix: np.ndarray
    ) -> tuple[list[Cache], list[Cache]]:
        """A batch's cross keys and values with those of requests ``ix`` in rows ``at``."""
        keys, values = self.cross(ix)
        put = self.tensors.put
        return (
            [put(c, at, k) for c, k in zip(cross_keys, keys, strict=True)],
            [put(c, at, v) for c, v in zip(cross_values, values, strict=True)],
        )


class HostEncoded(Encoded):
    """Encoded requests in numpy caches, packed several to an encoder row."""

    @staticmethod
    def place(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each text's encoder row and start in it (:func:`pack`)."""
        return pack(lengths)

    def _gather(self, ix: np.ndarray, S: int) -> tuple[list[Cache], list[Cache]]:
        W = int(self.cross_keys[0].shape[2])
        at = np.minimum(self.start[ix][:, None] + np.arange(S), W - 1)  # (n, S) columns of each one's row
        of = self.row[ix][:, None]
        caches = (self.cross_keys, self.cross_values)
        keys, values = ([c[of, :, at].transpose(0, 2, 1, 3) for c in layers] for layers in caches)
        return keys, values

    def adopt(self, ix: np.ndarray) -> tuple[list[Cache], list[Cache]]:
        """The requests' cross caches, contiguous (the encoder's own, when unshared)."""
        keys, values = self.cross(ix)
        return [np.ascontiguousarray(c) for c in keys], [np.ascontiguousarray(c) for c in values]

    def write(
        self, cross_keys: list[Cache], cross_values: list[Cache], at: np.ndarray, ix: np.ndarray
    ) -> tuple[list[Cache], list[Cache]]:
        """Write the cross keys and values of requests ``ix`` into rows ``at`` of a batch's, in place, straight out
        of the encoder rows they were packed into; the rest of those rows zero (masked columns)."""
        row, start, used = self.row[ix], self.start[ix], self.lengths[ix]
        for mine, theirs in zip((*cross_keys, *cross_values), (*self.cross_keys, *self.cross_values), strict=True):
            _beam.copy_spans(mine, at, theirs, row, start, used)
        return cross_keys, cross_values


def encode(
    runner: StepRunner, requests: list[tuple[Hashable, DecodeRequest]], kind: type[Encoded] = HostEncoded
) -> tuple[Encoded, float]:
    """Encode requests in one encoder call; returns them (as ``kind``: :class:`HostEncoded` for numpy caches,
    :class:`Encoded` for device ones) and the encoder seconds."""
    spec = runner.spec
    lengths = np.array([len(r.src) for _, r in requests])
    row, start = kind.place(lengths)
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
    encoded = kind(keys, texts, lengths, row, start, enc.cross_keys, enc.cross_values, attentions, runner.tensors)
    return encoded, seconds
