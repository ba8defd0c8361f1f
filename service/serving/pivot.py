"""A pair that no bundle serves, served in two hops through a pivot language (English by default): X→Y as X→via,
then via→Y, each hop the whole text pipeline of its pair's engine (spans, glossaries, lines, sentences).

The first hop's text is the second hop's input, as a client would send it. A glossary of X→Y (the request's, over
the ``glossary_dir`` file of X-Y) is enforced on the first hop, which writes its Y terms into the pivot text; the
second hop keeps those terms as they are (``keep``), so they reach the output unchanged. Each hop's own glossary
file applies on that hop, under the X→Y terms. Both hops count against the one deadline of the request. Decoding
defaults: the X→Y pair's own (``pair_defaults``) on both hops, else each hop's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from service.errors import PivotOnly
from service.serving.catalog import Pair, Pivot
from service.serving.route import Route
from service.serving.translation import AttentionResult, Filters, Gone, Hop, Options, Translation
from service.settings import PairDecoding


class PivotRoute:
    """``pivot.source`` → ``pivot.target`` through ``pivot.via``: ``first`` and ``second`` are the two direct routes.

    Args:
        pivot: the pair and its pivot language.
        first: the route of source → via.
        second: the route of via → target.
        glossary: the pair's own glossary file (source term → target term), under a request's own entries.
        decoding: the pair's own decoding defaults, under a request's own options and over each hop's.
    """

    def __init__(
        self,
        pivot: Pivot,
        first: Route,
        second: Route,
        glossary: Mapping[str, str] | None = None,
        decoding: PairDecoding | None = None,
    ) -> None:
        self.pivot, self.first, self.second = pivot, first, second
        self.glossary = dict(glossary or {})
        self.decoding = decoding or PairDecoding()

    @property
    def pair(self) -> Pair:
        return self.pivot.pair

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]:
        """Translate ``texts`` through the pivot: the first hop's best translations are the second hop's texts;
        alternatives come from the second hop. With ``details``, each translation lists its hops.

        Raises:
            What :meth:`Route.translate` raises, for either hop.
        """
        arrival = time.monotonic() if arrival is None else arrival
        options = options.defaulted(self.decoding.beam_size, self.decoding.length_penalty)
        terms = {**self.glossary, **(options.glossary or {})}
        first = replace(options, alternatives=0, glossary=terms or None, alignments=False)
        middle = await self.first.translate(texts, first, gone, arrival)
        kept = tuple(dict.fromkeys((*options.keep, *terms.values())))
        second = replace(options, glossary=None, keep=kept, alignments=False)  # its source is the middle text
        out = await self.second.translate([m.text for m in middle], second, gone, arrival)
        if not options.details:
            return out
        (s, v), (_, t) = self.pivot.hops
        return [
            Translation(o.text, o.alternatives, None, (Hop(s, v, m.text, m.details), Hop(v, t, o.text, o.details)))
            for m, o in zip(middle, out, strict=True)
        ]

    async def attention(
        self,
        texts: Sequence[str],
        options: Options,
        filters: Filters,
        target_texts: Sequence[str | None] | None = None,
        gone: Gone | None = None,
        arrival: float | None = None,
    ) -> list[AttentionResult]:
        """Never answers: each hop has its own model and weights.

        Raises:
            PivotOnly: naming the two pairs to ask instead.
        """
        (s, v), (_, t) = self.pivot.hops
        raise PivotOnly(
            f"{s}→{t} is served through {v} ({s}→{v}, then {v}→{t}), and each hop has its own attention weights: "
            f"ask /attention for source {s!r}, target {v!r}, then for source {v!r}, target {t!r} with the first "
            "answer's translatedText"
        )
