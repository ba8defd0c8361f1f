"""``source: "auto"``: each text's language is detected, and the text goes to the pair from that language into the
target. Texts of one language are translated together; the answers come back in the texts' order."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol

from service.errors import UnknownPair
from service.serving.translation import Gone, Options, Translation
from service.text.detect import Detection, Detector


class PairEngine(Protocol):
    """What auto-detection needs of an engine (service.serving.engine.Engine, or a fake in the tests)."""

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]: ...


def detect_sources(
    detector: Detector, texts: Sequence[str], target: str, pairs: Sequence[tuple[str, str]]
) -> list[Detection]:
    """Each text's detected language. A blank text, which has none, takes the commonest language of the others
    (confidence 0), or the first served source into ``target`` when every text is blank.

    Raises:
        UnknownPair: no served pair goes into ``target``, or a text's language has no pair into it.
    """
    sources = [s for s, t in pairs if t == target]
    if not sources:
        served = ", ".join(f"{s}→{t}" for s, t in pairs)
        raise UnknownPair(f"no model translates into {target!r}; this server serves {served} (GET /languages)")
    found = [detector.best(t) for t in texts]
    languages = Counter(d.language for d in found if d is not None)
    fallback = languages.most_common(1)[0][0] if languages else sources[0]
    detections = [d if d is not None else Detection(fallback, 0.0) for d in found]
    for i, d in enumerate(detections):
        if d.language not in sources:
            raise UnknownPair(
                f"q[{i}] was detected as {d.language!r} (confidence {d.confidence:g}), and no model translates "
                f"{d.language}→{target}; this server translates into {target} from {', '.join(sources)}: set "
                "'source' explicitly"
            )
    return detections


async def translate_auto(
    engines: Mapping[tuple[str, str], PairEngine],
    detector: Detector,
    texts: Sequence[str],
    target: str,
    options: Options,
    gone: Gone | None = None,
    arrival: float | None = None,
) -> tuple[list[Translation], list[Detection]]:
    """Translate texts whose language is detected; returns the translations and detections, in the texts' order.

    Raises:
        UnknownPair: as :func:`detect_sources`.
        TooLarge, QueueFull, DeadlineExceeded, ClientGone: as Engine.translate.
    """
    detections = detect_sources(detector, texts, target, list(engines))
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(detections):
        groups.setdefault(d.language, []).append(i)
    if len(groups) == 1:  # the usual case: one language, no task of its own
        engine = engines[(detections[0].language, target)]
        return list(await engine.translate(texts, options, gone, arrival)), detections
    tasks = [
        asyncio.ensure_future(engines[(lang, target)].translate([texts[i] for i in idx], options, gone, arrival))
        for lang, idx in groups.items()
    ]
    try:
        answers = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()  # nothing for a finished one; after a failure the others' rows are freed
    out: list[Translation | None] = [None] * len(texts)
    for idx, translations in zip(groups.values(), answers, strict=True):
        for i, t in zip(idx, translations, strict=True):
            out[i] = t
    return [t for t in out if t is not None], detections
