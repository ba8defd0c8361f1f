"""HTML: text translated, markup kept. lxml parses the document (a fragment or a whole page); each block's inline
content is translated as one text whose inline tags are protected spans (service/text/spans.py), which
cross-attention places; block structure, attributes, ``<script>``, ``<style>`` and ``translate="no"`` are left as
they are, and lxml writes the result, so it is well-formed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

import lxml.html
from lxml import etree

from service.formats.base import Translate
from service.formats.text import decode_utf8

INLINE = frozenset(
    "a abbr b bdi bdo br cite code data dfn em font i img kbd label mark q s samp small span strong sub sup time tt "
    "u var wbr".split()
)
UNTOUCHED = frozenset({"script", "style", "noscript", "template", "pre", "textarea", "svg", "math"})


@dataclass
class _Units:
    """The texts to translate and where each goes back: (element, "text" | "tail" | "inner")."""

    texts: list[str] = field(default_factory=list)
    places: list[tuple[lxml.html.HtmlElement, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # inline elements left alone, by marker number

    def add(self, text: str | None, element: lxml.html.HtmlElement, where: str) -> None:
        if text and text.strip():
            self.texts.append(text)
            self.places.append((element, where))


def _untouched(el: lxml.html.HtmlElement) -> bool:
    return not isinstance(el.tag, str) or el.tag in UNTOUCHED or el.get("translate", "").lower() == "no"


def _inline_only(el: lxml.html.HtmlElement) -> bool:
    return all((isinstance(c.tag, str) and c.tag in INLINE and _inline_only(c)) or _untouched(c) for c in el)


def _collect(el: lxml.html.HtmlElement, units: _Units) -> None:
    """Walk the tree: a block of inline content is one text, else its own text and each child's tail are."""
    if _untouched(el):
        return
    if len(el) and el.tag not in INLINE and _inline_only(el):
        units.add(_inner(el, units), el, "inner")
        return
    if not len(el):
        units.add(el.text, el, "text")
        return
    units.add(el.text, el, "text")
    for child in el:
        _collect(child, units)
        units.add(child.tail, child, "tail")


def _inner(el: lxml.html.HtmlElement, units: _Units) -> str:
    """The element's content as HTML, each untouched inline element replaced by an empty marker tag."""
    out = [escape(el.text or "", quote=False)]
    for child in el:
        if _untouched(child):
            out.append(f'<attnserve-kept n="{len(units.kept)}"/>')
            units.kept.append(etree.tostring(child, encoding=str, method="html", with_tail=False))
            out.append(escape(child.tail or "", quote=False))
        else:
            out.append(etree.tostring(child, encoding=str, method="html", with_tail=True))
    return "".join(out)


def _put(el: lxml.html.HtmlElement, where: str, text: str, units: _Units) -> None:
    if where == "text":
        el.text = text
    elif where == "tail":
        el.tail = text
    else:
        for n, original in enumerate(units.kept):
            text = text.replace(f'<attnserve-kept n="{n}"/>', original).replace(f'<attnserve-kept n="{n}">', original)
        wrapper = lxml.html.fragment_fromstring(text, create_parent="div")
        for child in list(el):
            el.remove(child)
        el.text = wrapper.text
        for child in list(wrapper):
            el.append(child)


async def translate_html(html: str, translate: Translate) -> str:
    """``html`` with its text translated and its markup kept.

    Args:
        html: a fragment (``<p>Hi <b>there</b></p>``, or text with inline tags) or a whole document.
        translate: the text translator (inline tags in a text it is given are protected spans); a text it answers
            None for stays as it is.
    """
    if not html.strip():
        return html
    whole = html.lstrip().lower().startswith(("<!doctype", "<html"))
    root = lxml.html.document_fromstring(html) if whole else lxml.html.fragment_fromstring(html, create_parent="div")
    units = _Units()
    _collect(root, units)
    translated = await translate(units.texts) if units.texts else []
    for (el, where), source, text in zip(units.places, units.texts, translated, strict=True):
        _put(el, where, source if text is None else text, units)
    if whole:
        doctype = str(root.getroottree().docinfo.doctype)
        body = etree.tostring(root, encoding=str, method="html")
        return f"{doctype}\n{body}" if doctype else body
    inner = escape(root.text or "", quote=False)
    return inner + "".join(etree.tostring(c, encoding=str, method="html", with_tail=True) for c in root)


async def translate_file(data: bytes, translate: Translate, target: str) -> bytes:
    """An .html file (UTF-8) translated as :func:`translate_html` does.

    Raises:
        UnreadableFile: the file is not UTF-8 text.
    """
    return (await translate_html(decode_utf8(data, ".html file"), translate)).encode("utf-8")
