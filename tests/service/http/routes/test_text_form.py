"""/translate keeps a text's form, its protected spans, glossary terms and HTML markup, on a real server with the
tiny random bundle: its words are noise, so these check the mechanics (exact restoration, never a dropped span)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lxml.html
import pytest

from service.decoding import BatchDecoder
from tests.service.conftest import Server, ServerFactory


def translate(server: Server, q: Any, **extra: Any) -> Any:
    with server.client() as c:
        r = c.post("/translate", json={"q": q, "source": "en", "target": "ja", "max_length": 12, **extra})
    assert r.status_code == 200, r.text
    return r.json()["translatedText"]


@pytest.mark.parametrize("text", ["Open the file\n", "\n  Open the file  \n", "Usage:\n\n  -h  help\n", " Save\r\n"])
def test_edge_whitespace_and_lines_are_kept(server: Server, text: str) -> None:
    out = translate(server, text)
    assert out.count("\n") == text.count("\n") and out.count("\r") == text.count("\r")
    for line, translated in zip(text.splitlines(), out.splitlines(), strict=True):
        if not line.strip():
            assert translated == line  # an empty line stays as it is
    lead, trail = len(text) - len(text.lstrip()), len(text) - len(text.rstrip())
    assert out[:lead] == text[:lead] and out[len(out) - trail :] == text[len(text) - trail :]


def test_empty_and_whitespace_texts_come_back_without_decoding(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = []
    step = BatchDecoder.step
    monkeypatch.setattr(BatchDecoder, "step", lambda self: steps.append(1) or step(self))
    assert translate(server, ["", "  ", "\n\n"]) == ["", "  ", "\n\n"]
    assert translate(server, "") == ""
    assert steps == []


def test_a_multi_line_text_is_its_lines_translated(server: Server) -> None:
    lines = ["Open the file", "Save as", "Delete the selected files"]
    one_by_one = translate(server, lines)
    one_line = [" ".join(t.split()) if "\n" in t else t for t in one_by_one]  # a line's translation stays on it
    assert translate(server, "\n".join(lines)) == "\n".join(one_line)


def test_long_lines_are_split_into_sentences_and_joined(make_server: ServerFactory) -> None:
    server = make_server(sentence_split_chars=20, max_wait_ms=20)
    sentences = ["Open the file.", "Save it as text.", "Delete the files."]
    parts = translate(server, sentences)
    assert translate(server, " ".join(sentences)) == " ".join(parts)


SPANS = [
    "Could not open %s: %d files, %5.2f%%, %1$s and %(name)s",
    "Delete {0} from {name}? {{x}}",
    "Marker [X7X] and [X12X] stay",
    "See https://example.org/a?b=1 or write to me@example.com",
    "Fish &amp; chips &#169;",
    'Click <a href="/x">here</a> to <b>open</b><br/>',
    "Hello 😀 world 🦄",
]


@pytest.mark.parametrize("text", SPANS)
def test_every_span_comes_back_exactly(server: Server, text: str) -> None:
    from service.text.spans import find_spans

    out = translate(server, text)
    assert "\ufffd" not in out
    for span in find_spans(text, frozenset(c for c in text if ord(c) < 0x1F000)):
        assert span.output in out, (span, out)
    assert len(translate(server, [text, text])) == 2


def test_spans_keep_their_count(server: Server) -> None:
    out = translate(server, "%s to %s and %s")
    assert out.count("%s") == 3


def test_glossary_and_keep_terms_are_in_the_output(server: Server) -> None:
    out = translate(server, "Open Inkscape with GIMP", glossary={"Inkscape": "インクスケープ"}, keep=["GIMP"])
    assert "インクスケープ" in out and "GIMP" in out and "Inkscape" not in out


def test_a_glossary_file_per_pair(make_server: ServerFactory, tmp_path: Path) -> None:
    (tmp_path / "en-ja.tsv").write_text("# terms\nInkscape\tインクスケープ\n", encoding="utf-8")
    server = make_server(glossary_dir=tmp_path)
    assert "インクスケープ" in translate(server, "Open Inkscape")
    assert "イ" in translate(server, "Open Inkscape", glossary={"Inkscape": "イ"})


def test_html_keeps_structure_attributes_scripts_and_untranslated_parts(server: Server) -> None:
    html = (
        '<div class="c" id="main"><h1>Settings</h1><p>Click <a href="/x" title="Open">here</a> now.</p>'
        '<script>var a = "Open <b>";</script><style>p { color: red }</style>'
        '<p translate="no">Open file</p><ul><li>Save <span translate="no">Foo</span></li></ul></div>'
    )
    out = translate(server, html, format="html")
    tree = lxml.html.fragment_fromstring(out)
    assert [e.tag for e in tree.iter()] == [e.tag for e in lxml.html.fragment_fromstring(html).iter()]
    assert (
        tree.get("class") == "c" and tree.find(".//a").get("href") == "/x" and tree.find(".//a").get("title") == "Open"
    )
    assert tree.find(".//script").text == 'var a = "Open <b>";' and tree.find(".//style").text == "p { color: red }"
    assert tree.find('.//p[@translate="no"]').text == "Open file" and tree.find(".//span").text == "Foo"
    assert tree.find(".//h1").text != "Settings"


def test_html_documents_keep_their_doctype(server: Server) -> None:
    out = translate(
        server, "<!DOCTYPE html><html><head><title>Help</title></head><body><p>Open</p></body></html>", format="html"
    )
    assert out.startswith("<!DOCTYPE html>") and "<body><p>" in out


def test_attention_with_an_empty_text_is_a_400_naming_q(server: Server) -> None:
    with server.client() as c:
        r = c.post("/attention", json={"q": "", "source": "en", "target": "ja"})
    assert r.status_code == 400 and "q" in r.json()["error"]
