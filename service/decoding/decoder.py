"""The decoder: :class:`BatchDecoder` holds the rows (hypotheses) of many requests in two batches
(:class:`~service.decoding.batch.Batch`): the young one, where requests join, and the old one, for rows that have
decoded many tokens. New requests are admitted between steps and finished ones leave (iteration-level batching).
The cache layout of its batches is chosen here, once, from the runner's decoder graph form and its tensors."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import numpy as np

from service.decoding.appended import AppendedCaches
from service.decoding.batch import Batch
from service.decoding.caches import CacheLayout
from service.decoding.encoding import Encoded, HostEncoded, encode
from service.decoding.gathered import GatheredCaches
from service.decoding.in_place import DeviceInPlaceCaches, HostInPlaceCaches
from service.decoding.request import DecodeRequest, DecodeResult
from service.decoding.step_runner import StepRunner
from service.runtime.bundle import ModelSpec
from service.runtime.tensors import HostTensors


def layout_of(runner: StepRunner) -> tuple[CacheLayout, type[Encoded]]:
    """Empty caches of the layout that ``runner``'s decoder graph takes (its form) on its tensors, and the kind of
    its encoded requests (packed on the host)."""
    form, tensors, spec = runner.form, runner.tensors, runner.spec
    host = isinstance(tensors, HostTensors)
    encoded = HostEncoded if host else Encoded
    if form.cache == "gathered":
        return GatheredCaches(tensors, spec), encoded
    if form.cache != "in_place":
        return AppendedCaches(tensors, spec), encoded
    if host:
        return HostInPlaceCaches(tensors, spec, form.greedy_tokens, form.grouped_cross), encoded
    return DeviceInPlaceCaches(tensors, spec, form.greedy_tokens), encoded


class BatchDecoder:
    """Decodes the rows of many requests together, one step at a time; knows nothing of HTTP or queues.

    Rows sit in at most two batches, one decoder call each a step. Requests join the young batch. Once its cache
    is ``2 * age`` slots long, its rows that have decoded more than ``age`` tokens move to the old batch: one long
    request would otherwise make every row that joins after it attend over (and copy) its long cache, each step.
    A row's answer does not depend on the batch it is in. With caches written in place a row attends over its own
    tokens only, whatever its neighbours' lengths, and nothing ages: one batch.

    Requests are encoded (:meth:`encode`: one encoder call for many) before they join (:meth:`join`), possibly
    steps later; :meth:`admit` does both at once.
    """

    def __init__(self, runner: StepRunner, age: int = 32) -> None:
        self.runner = runner
        self.spec: ModelSpec = runner.spec
        self.age = age
        caches, self._encoded = layout_of(runner)
        numbers = itertools.count()
        self.young, self.old = Batch(runner, numbers, caches), Batch(runner, numbers, caches)
        self.waiting: list[Encoded] = []  # encoded ahead (:meth:`encode`), until every request of theirs has left

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
        """The keys of the requests it decodes."""
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
        encoded, seconds = encode(self.runner, requests, self._encoded)
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


def decode(runner: StepRunner, requests: list[DecodeRequest]) -> list[DecodeResult]:
    """Decode requests as one batch to the end (the CLI, evaluation and tests use this; the service's scheduler
    drives :class:`BatchDecoder` itself)."""
    decoder = BatchDecoder(runner)
    decoder.admit(list(enumerate(requests)))
    results: dict[Hashable, DecodeResult] = {}
    while decoder.num_rows:
        done, _ = decoder.step()
        results.update(done)
    return [results[i] for i in range(len(requests))]
