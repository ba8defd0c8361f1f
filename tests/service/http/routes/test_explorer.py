"""The attention explorer page (GET /) in a real headless Chromium, against a real server with the tiny bundle.

Needs Debian's ``chromium`` and PyPI's ``playwright``: skipped without them, except under CI=true where it fails.
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bench.screenshot import CHROMIUM, DESKTOP, chromium, open_explorer, translate
from tests.service.conftest import Server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Request, ViewportSize

ARTIFACTS = Path(__file__).resolve().parents[4] / "test-artifacts"
PHONE: ViewportSize = {"width": 390, "height": 844}
TEXT = "Delete the selected files?"
LAYERS, HEADS = 2, 4  # the tiny bundle's decoder and encoder layers, and heads


def label(piece: str) -> str:
    """How the page shows a SentencePiece piece: no word-start marker, a lone marker as ␣; a byte piece as its
    character, ↵ or ⇥ for a line break or tab, else as an escape."""
    if byte := re.fullmatch(r"<0x([0-9A-F]{2})>", piece):
        code = int(byte[1], 16)
        symbols = {0x0A: "↵", 0x0D: "↵", 0x09: "⇥"}
        return symbols.get(code) or (chr(code) if 0x20 < code < 0x7F else f"\\x{byte[1]}")
    return piece.removeprefix("▁").replace("▁", " ") or "␣"


def api_attention(server: Server, **body: Any) -> dict[str, Any]:
    with server.client() as c:
        r = c.post("/attention", json={"q": TEXT, "source": "en", "target": "ja", **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the Python package playwright (pip install playwright)")
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (apt-get install --no-install-recommends chromium)")
    if missing:
        reason = "the explorer test needs " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with chromium() as b:
        yield b


class Explorer:
    """The page in a fresh browser context, with every request, POST /attention body and console error recorded."""

    def __init__(self, browser: Browser, server: Server, viewport: ViewportSize) -> None:
        self.origin = server.url
        self.context = browser.new_context(viewport=viewport, accept_downloads=True)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.posted: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.page.on("request", self.record)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        open_explorer(self.page, server.url + "/")

    def record(self, request: Request) -> None:
        self.requests.append(request.url)
        if request.url.endswith("/attention"):
            self.posted.append(json.loads(request.post_data or "null"))

    def outside(self) -> list[str]:
        """Requests that left the page's origin (blob: URLs of downloads are the page's own)."""
        return [u for u in self.requests if not u.removeprefix("blob:").startswith(self.origin + "/")]

    def view(self) -> dict[str, Any]:
        view: dict[str, Any] = self.page.evaluate("window.attnserve.view")
        return view

    def head_map(self) -> str:
        """The head view's pixels, as a data URL."""
        url: str = self.page.evaluate("document.getElementById('map').toDataURL()")
        return url

    def numbers(self) -> tuple[list[str], list[str], int]:
        """Column labels, row labels and the number of cells of the head view's table of numbers."""
        if not self.page.locator("#numbers-box").evaluate("d => d.open"):
            self.page.click("#numbers-box summary")
        table = self.page.locator("#numbers")
        table.locator("tbody tr").first.wait_for()  # the table is built on the (asynchronous) toggle event
        cols = table.locator("thead th").all_text_contents()[1:]
        rows = table.locator("tbody th").all_text_contents()
        return cols, rows, table.locator("tbody td").count()

    def hover(self, i: int, j: int) -> tuple[float, str]:
        """Point at head-view cell (row i, column j) and read the weight in the tooltip."""
        canvas = self.page.locator("#map")
        canvas.scroll_into_view_if_needed()
        g = {k: float(v) for k, v in canvas.evaluate("c => ({...c.dataset})").items()}
        box = canvas.bounding_box()
        assert box is not None
        x, y = box["x"] + g["left"] + (j + 0.5) * g["cell"], box["y"] + g["top"] + (i + 0.5) * g["cell"]
        self.page.mouse.move(x, y)
        tip = self.page.locator("#tip")
        assert tip.is_visible()
        text = tip.inner_text()
        found = re.search(r"weight (\d+\.\d{4})", text)
        assert found, text
        return float(found.group(1)), text


@pytest.fixture
def open_page(browser: Browser, server: Server) -> Iterator[Callable[[ViewportSize], Explorer]]:
    pages: list[Explorer] = []

    def open_(viewport: ViewportSize) -> Explorer:
        pages.append(Explorer(browser, server, viewport))
        return pages[-1]

    yield open_
    for p in pages:
        p.context.close()


def test_model_and_head_views_show_the_api_numbers(open_page: Callable[..., Explorer], server: Server) -> None:
    ex = open_page(DESKTOP)
    page = ex.page
    status, body = translate(page, TEXT)
    assert status == 200
    assert page.locator("#translation").text_content() == body["translatedText"]
    S, T = len(body["source_tokens"]), len(body["target_tokens"])

    for kind in ("encoder", "decoder", "cross"):  # the model view: one map per layer × head
        page.select_option("#kind", kind)
        assert page.locator("#grid .layer").count() == LAYERS
        assert page.locator("#grid .mini").count() == LAYERS * HEADS
        assert page.locator("#grid .mini[aria-pressed=true]").count() == 1

    # The cross-attention head view: T × S cells, target tokens down, source tokens across.
    assert ex.view() == {"kind": "cross", "layer": 0, "head": 0, "average": False}
    canvas = page.locator("#map")
    assert (canvas.get_attribute("data-rows"), canvas.get_attribute("data-cols")) == (str(T), str(S))
    cols, rows, cells = ex.numbers()
    assert cols == [label(t) for t in body["source_tokens"]]
    assert rows == [label(t) for t in body["target_tokens"]]
    assert cells == T * S

    # Choosing another layer, head or kind redraws the head view.
    seen = {ex.head_map()}
    for layer, head in ((1, 2), (1, 3), (0, 3)):
        page.click(f"#grid .mini[data-layer='{layer}'][data-head='{head}']")
        assert ex.view() == {"kind": "cross", "layer": layer, "head": head, "average": False}
        assert page.locator(f"#grid .mini[data-layer='{layer}'][data-head='{head}']").get_attribute("aria-pressed")
        seen.add(ex.head_map())
    page.select_option("#kind", "encoder")
    seen.add(ex.head_map())
    assert len(seen) == 5
    assert ex.numbers()[:2] == ([label(t) for t in body["source_tokens"]],) * 2

    # The page's numbers are the API's: a hovered cell of one head, and of the head average.
    page.select_option("#kind", "cross")
    page.click("#grid .mini[data-layer='1'][data-head='2']")
    api = api_attention(server, kinds=["cross"])
    weight, tip = ex.hover(1, 2)
    assert abs(weight - api["cross"][1][2][1][2]) < 1e-4
    assert f"“{label(body['target_tokens'][1])}” → “{label(body['source_tokens'][2])}”" in tip
    page.check("#average")
    assert ex.view()["average"] and page.locator("#grid .mini[aria-pressed=true]").count() == HEADS
    weight, _ = ex.hover(T - 1, 0)
    assert abs(weight - sum(h[T - 1][0] for h in api["cross"][1]) / HEADS) < 1e-4

    # Keyboard: the map takes focus and the arrow keys move the cursor (from the first cell, once the pointer left).
    page.mouse.move(0, 0)
    page.focus("#map")
    for key in ("ArrowDown", "ArrowDown", "ArrowRight"):
        page.keyboard.press(key)
    assert "(row 1, column 1)" in page.locator("#tip").inner_text()

    # Downloads: the shown map as PNG, the response as JSON.
    page.uncheck("#average")
    with page.expect_download() as png:
        page.click("#save-png")
    assert png.value.suggested_filename == "attention-cross-layer1-head2.png"
    assert Path(png.value.path()).read_bytes().startswith(b"\x89PNG")
    with page.expect_download() as saved:
        page.click("#save-json")
    assert json.loads(Path(saved.value.path()).read_text(encoding="utf-8")) == body

    ARTIFACTS.mkdir(exist_ok=True)
    page.mouse.move(0, 0)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=ARTIFACTS / "explorer.png")
    assert ex.errors == []
    assert ex.outside() == []


def test_force_decoding_and_beam_size(open_page: Callable[..., Explorer], server: Server) -> None:
    ex = open_page(DESKTOP)
    target_text = "ファイルを開く"
    status, body = translate(ex.page, "Open file", target_text=target_text)
    assert status == 200
    assert ex.posted[-1]["target_text"] == target_text
    api = api_attention(server, q="Open file", target_text=target_text, kinds=["cross"])
    assert body["target_tokens"] == api["target_tokens"]
    _, rows, _ = ex.numbers()
    assert rows == [label(t) for t in api["target_tokens"]]
    assert ex.page.locator("#translation").text_content() == api["translatedText"]
    assert "forced decoding" in (ex.page.locator("#status").text_content() or "")

    status, body = translate(ex.page, TEXT, beam_size=3)
    assert status == 200
    assert ex.posted[-1]["beam_size"] == 3 and ex.posted[-1]["target_text"] is None
    assert ex.page.locator("#translation").text_content() == api_attention(server, beam_size=3)["translatedText"]
    assert ex.errors == []
    assert ex.outside() == []


def test_api_errors_are_shown_plainly(open_page: Callable[..., Explorer], server: Server) -> None:
    ex = open_page(DESKTOP)
    alert = ex.page.get_by_role("alert")
    too_long = "a" * 5001
    status, body = translate(ex.page, too_long)
    assert status == 413
    assert alert.is_visible()
    assert alert.inner_text() == body["error"] and "max_chars=5000" in body["error"]
    assert ex.page.locator("#result").is_hidden()
    # Chromium logs every 4xx answer to the console; that one is expected, nothing else.
    assert all("status of 413" in e for e in ex.errors), ex.errors

    status, _ = translate(ex.page, TEXT)
    assert status == 200
    assert alert.is_hidden() and ex.page.locator("#result").is_visible()
    assert ex.outside() == []


def test_phone_width(open_page: Callable[..., Explorer]) -> None:
    ex = open_page(PHONE)
    status, _ = translate(ex.page, TEXT)
    assert status == 200
    width = ex.page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"] + 1
    assert ex.page.locator("#map-scroll").evaluate("e => e.getBoundingClientRect().right") <= PHONE["width"]
    ex.hover(0, 0)
    ARTIFACTS.mkdir(exist_ok=True)
    ex.page.mouse.move(0, 0)
    ex.page.screenshot(path=ARTIFACTS / "explorer-phone.png", full_page=True)
    assert ex.errors == []
    assert ex.outside() == []


def test_a_text_of_several_segments_is_shown_segment_by_segment(
    open_page: Callable[..., Explorer], server: Server
) -> None:
    ex = open_page(DESKTOP)
    page = ex.page
    text = "Open the selected file\n\n  Save %s now\nClose <b>all</b> windows."
    status, body = translate(page, text)
    assert status == 200 and len(body["segments"]) == 3
    with server.client() as c:
        translated = c.post("/translate", json={"q": text, "source": "en", "target": "ja"}).json()["translatedText"]
    assert body["translatedText"] == translated
    assert page.locator("#translation").text_content() == translated  # its lines kept
    assert page.locator("#segment-box").is_visible() and page.locator("#segment option").count() == 3
    for i, segment in enumerate(body["segments"]):
        page.select_option("#segment", str(i))
        assert page.locator("#translation mark").text_content() == translated[slice(*segment["target_offsets"])]
        cols, rows, cells = ex.numbers()
        assert cols == [label(t) for t in segment["source_tokens"]]
        assert rows == [label(t) for t in segment["target_tokens"]]
        assert cells == len(cols) * len(rows)
        assert not any("<0x" in t for t in cols + rows)
        weight, _ = ex.hover(1, 1)
        assert abs(weight - segment["cross"][0][0][1][1]) < 1e-4
    page.select_option("#segment", "1")
    ARTIFACTS.mkdir(exist_ok=True)
    page.mouse.move(0, 0)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=ARTIFACTS / "explorer-segments.png")
    assert ex.errors == []
    assert ex.outside() == []


def test_the_issue_example_shows_one_segment_and_no_line_break_token(
    open_page: Callable[..., Explorer], server: Server
) -> None:
    ex = open_page(DESKTOP)
    status, body = translate(ex.page, "Open the selected file\n")
    assert status == 200 and len(body["segments"]) == 1
    assert ex.page.locator("#segment-box").is_hidden()
    with server.client() as c:
        r = c.post("/translate", json={"q": "Open the selected file\n", "source": "en", "target": "ja"})
    assert ex.page.locator("#translation").text_content() == r.json()["translatedText"]
    cols, rows, _ = ex.numbers()
    assert cols == [label(t) for t in body["source_tokens"]] and "<0x0A>" not in body["source_tokens"]
    assert not any("<0x" in t for t in cols + rows)
    assert ex.errors == []


def test_the_alignment_view_links_the_words_the_api_aligns(open_page: Callable[..., Explorer], server: Server) -> None:
    ex = open_page(DESKTOP)
    page = ex.page
    text = "Open the selected file\nSave %s now"
    status, body = translate(page, text)
    assert status == 200 and ex.posted[-1]["alignments"] is True
    links = body["alignments"]
    assert links
    with server.client() as c:
        translated = c.post("/translate", json={"q": text, "source": "en", "target": "ja", "alignments": True}).json()
    assert links == translated["alignments"]
    shown = {(w.get_attribute("data-side"), w.text_content()) for w in page.locator("#links-view .word").all()}
    assert shown == {("source", text[slice(*link["source"])]) for link in links} | {
        ("target", body["translatedText"][slice(*link["target"])]) for link in links
    }
    assert page.locator("#links line").count() == len(links)
    page.click("#links-box summary")
    assert page.locator("#links-table td").count() == 2 * len(links)
    first = links[0]
    word = page.locator(f'#source-words .word[data-start="{first["source"][0]}"]')
    word.hover()
    lit = page.locator("#links line.on").count()
    assert lit == sum(link["source"] == first["source"] for link in links)
    assert page.locator(f'#target-words .word.on[data-start="{first["target"][0]}"]').count() == 1
    page.mouse.move(0, 0)
    assert page.locator("#links line.on").count() == 0
    page.locator("#target-words .word").first.focus()  # the keyboard reaches the words too
    assert page.locator("#links line.on").count() >= 1
    page.screenshot(path=ARTIFACTS / "explorer-alignment.png")
    assert ex.errors == []
    assert ex.outside() == []
