"""The ``alignments`` of /translate's and /attention's answers: a text's word links under the request's rule."""

from __future__ import annotations

from dataclasses import replace

from service.serving.alignment import DEFAULT, Alignable, Rule


def rule(layer: int | None, heads: list[int] | None) -> Rule:
    """The measured rule (service/serving/alignment.py's ``DEFAULT``), with the request's layer and heads where it
    gives them."""
    return replace(
        DEFAULT,
        layer=DEFAULT.layer if layer is None else layer,
        heads=DEFAULT.heads if heads is None else tuple(heads),
    )


def links_json(alignable: Alignable | None, chosen: Rule) -> list[dict[str, list[int]]] | None:
    """``[{"source": [start, end], "target": [start, end]}, ...]``; None for a text without them (a pivot's).

    Raises:
        NoSuchIndex: the rule's layer or a head does not exist.
    """
    if alignable is None:
        return None
    return [{"source": list(s), "target": list(t)} for s, t in alignable.links(chosen)]
