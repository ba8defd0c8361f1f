"""Long lines cut into sentences, so that each decodes within the model's length and the batch stays balanced.

sentencex (Wikimedia's rule-based segmenter) keeps every character, whitespace included, in its segments, so
joining them gives the line back; it cuts as pysbd does on UI text at a fraction of the cost (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from sentencex import segment


def sentences(line: str, language: str, min_chars: int) -> list[str]:
    """``line`` cut into sentences when it is longer than ``min_chars`` (else whole); ``"".join`` of the result is
    ``line``.

    Args:
        line: one line, without line breaks.
        language: the source language's code (sentencex's rules, with fallbacks for the others).
        min_chars: lines up to this length are kept whole.
    """
    if len(line) <= min_chars:
        return [line]
    parts = [p for p in segment(language, line) if p]
    return parts if "".join(parts) == line else [line]
