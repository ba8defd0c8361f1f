"""A bounded response cache for /translate: the translation of a text already translated with the same options,
without decoding it again (UI catalogs repeat their strings; LibreTranslate has one too).

One cache for the process, shared by every bundle's engines (each under keys of its own), least recently used
entries dropped first once the entries' estimated size passes the bound. A hit returns the very
:class:`~service.serving.engine.Translation` the first decoding gave, so an answer never depends on whether it was
cached.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

V = TypeVar("V")
ENTRY_BYTES = 240  # the dictionary slot, the key tuple and the value object around the strings


class LruCache(Generic[V]):
    """Values by key, at most ``capacity`` estimated bytes, least recently used dropped first.

    Args:
        capacity: bytes the entries may hold together (keys' and values' strings, as :meth:`put` is told, plus
            :data:`ENTRY_BYTES` an entry).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        """The value for ``key`` (now the most recently used), or None; counted as a hit or a miss."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: Hashable, value: V, *strings: str) -> None:
        """Keep ``value`` for ``key``; ``strings`` are what it holds (the text, its translations), for its size."""
        size = ENTRY_BYTES + sum(sys.getsizeof(s) for s in strings)
        if size > self.capacity:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old[1]
        self._entries[key] = (value, size)
        self.used += size
        while self.used > self.capacity:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.used -= dropped


async def through_cache(
    cache: LruCache[V],
    texts: Sequence[str],
    key: Hashable,
    translate: Callable[[list[str]], Awaitable[list[V]]],
    strings: Callable[[V], Sequence[str]],
) -> tuple[list[V], int]:
    """Each text's value from ``cache`` under ``(text, key)``, the others from one ``translate(missing)`` call (and
    kept, their size from ``strings(value)``); returns the values in order and how many texts were missing.

    Raises:
        Whatever ``translate`` raises; nothing is kept then.
    """
    found = [cache.get((t, key)) for t in texts]
    missing = [t for t, f in zip(texts, found, strict=True) if f is None]
    if not missing:
        return [f for f in found if f is not None], 0
    fresh = iter(await translate(missing))
    out = []
    for text, f in zip(texts, found, strict=True):
        if f is None:
            f = next(fresh)
            cache.put((text, key), f, text, *strings(f))
        out.append(f)
    return out, len(missing)
