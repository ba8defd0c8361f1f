"""A forced target (/attention's ``target_text``) cut as its source was: the same lines with text, the same
sentences on a line that the source's layout cuts into sentences, and each source span's text replaced by the
stand-in that replaced it in the source, so that the model is forced through what it would have read and written."""

from __future__ import annotations

from service.errors import LayoutMismatch
from service.text.lines import layout
from service.text.pipeline import Prepared
from service.text.sentences import sentences
from service.text.spans import Masked, stand_in


def forced_targets(prepared: Prepared, target_text: str, language: str) -> list[str]:
    """Per segment of ``prepared``'s one text, the part of ``target_text`` it is forced to, masked as the segment.

    Args:
        prepared: one text's segments (:meth:`~service.text.pipeline.TextPipeline.segmented`).
        target_text: the translation to force, laid out as the text.
        language: the target language (sentence rules).

    Raises:
        LayoutMismatch: ``target_text`` has another number of lines with text, or of sentences on a line whose
            source is cut into sentences.
    """
    (stretches,) = prepared.parts
    lines = layout(target_text).stretches
    if len(lines) != len(stretches):
        raise LayoutMismatch(
            f"target_text has {len(lines)} lines with text where q has {len(stretches)}: give it the same lines as q "
            "(edge whitespace and empty lines may differ)"
        )
    parts: list[str] = []
    for number, (line, stretch) in enumerate(zip(lines, stretches, strict=True), 1):
        cut = [line] if len(stretch) == 1 else [s.strip() for s in sentences(line, language, 0) if s.strip()]
        if len(cut) != len(stretch):
            raise LayoutMismatch(
                f"line {number} of target_text (counting lines with text) has {len(cut)} sentences where q's has "
                f"{len(stretch)}: q's lines longer than sentence_split_chars are cut into sentences, and each is "
                "forced to one sentence of the same line of target_text"
            )
        parts += cut
    return [p if s.masked is None else masked_like(s.masked, p) for s, p in zip(prepared.segments, parts, strict=True)]


def masked_like(masked: Masked, target: str) -> str:
    """``target`` with each group's text (its first occurrence not already taken) replaced by the group's stand-in;
    a group that ``target`` lacks stays missing, and is put back as a span the model dropped is."""
    taken: list[tuple[int, int, int]] = []  # (start, end, group)
    for group, text in enumerate(masked.outputs):
        start = target.find(text) if text else -1
        while start >= 0 and any(start < e and s < start + len(text) for s, e, _ in taken):
            start = target.find(text, start + 1)
        if start >= 0:
            taken.append((start, start + len(text), group))
    out, last = [], 0
    for start, end, group in sorted(taken):
        out += [target[last:start], stand_in(group)]
        last = end
    out.append(target[last:])
    return "".join(out)
