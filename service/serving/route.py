"""A served language pair as requests reach it: :class:`Route` is what the HTTP layer asks of a pair;
:class:`Direct` is a pair that one bundle serves, its engine taken from the registry for the request's length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.serving.catalog import Pair
from service.serving.engine import Engine
from service.serving.pairs import PairRegistry
from service.serving.translation import AttentionResult, Filters, Gone, Options, Translation


class Route(Protocol):
    """A served pair: translations of texts, and texts' attention weights (service/serving/engine.py's
    methods of the same names)."""

    @property
    def pair(self) -> Pair: ...

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]: ...

    async def attention(
        self,
        texts: Sequence[str],
        options: Options,
        filters: Filters,
        target_texts: Sequence[str | None] | None = None,
        gone: Gone | None = None,
        arrival: float | None = None,
    ) -> list[AttentionResult]: ...


class Direct:
    """A pair that one bundle serves: each call holds its engine (loaded first when it is not) until it ends.

    Calls raise what :meth:`PairRegistry.use` and the engine's methods raise.
    """

    def __init__(self, registry: PairRegistry[Engine], pair: Pair) -> None:
        self.registry = registry
        self.pair = pair

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]:
        """:meth:`Engine.translate` on the pair's engine."""
        async with self.registry.use(self.pair) as engine:
            return await engine.translate(texts, options, gone, arrival)

    async def attention(
        self,
        texts: Sequence[str],
        options: Options,
        filters: Filters,
        target_texts: Sequence[str | None] | None = None,
        gone: Gone | None = None,
        arrival: float | None = None,
    ) -> list[AttentionResult]:
        """:meth:`Engine.attention` on the pair's engine."""
        async with self.registry.use(self.pair) as engine:
            return await engine.attention(texts, options, filters, target_texts, gone, arrival)
