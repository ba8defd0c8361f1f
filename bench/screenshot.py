"""Screenshot of the attention explorer page of a running server, for the README.

python bench/screenshot.py --url http://127.0.0.1:8000 --out docs/explorer.png --text "Delete the selected files?"
python bench/screenshot.py --url http://127.0.0.1:8000 --out docs/alignment.png --pair en:ja --point Firefox \
    --text "Open the file in Firefox and save it as PDF."

Needs Debian's ``chromium`` and PyPI's ``playwright`` (never ``playwright install``: it downloads a browser). The
explorer test (tests/service/http/routes/test_explorer.py) launches the browser and drives the page with the helpers
below.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used, so that the test can skip cleanly when playwright is missing
    from playwright.sync_api import Browser, Page, ViewportSize

CHROMIUM = "/usr/bin/chromium"
# Headless, and nothing that phones home: the page must work offline, and the test records every request.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP: ViewportSize = {"width": 1280, "height": 800}


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's Chromium driven by Playwright, closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_explorer(page: Page, url: str) -> None:
    """Load the page and wait until it knows the language pairs (the Translate button is enabled then)."""
    page.goto(url)
    page.wait_for_selector("#go:enabled")


def translate(page: Page, text: str, target_text: str = "", beam_size: int = 1) -> tuple[int, Any]:
    """Fill the form, press Translate and wait until the page has drawn the answer (or shown the error).

    Returns:
        The status code and JSON body of the page's POST /attention.
    """
    page.fill("#text", text)
    page.fill("#target-text", target_text)
    page.fill("#beam", str(beam_size))
    with page.expect_response(lambda r: r.url.endswith("/attention")) as answer:
        page.click("#go")
    page.wait_for_selector('#main[aria-busy="false"]')
    return answer.value.status, answer.value.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server (its explorer page is at /)")
    ap.add_argument("--out", type=Path, default=Path("docs/explorer.png"))
    ap.add_argument("--text", default="Delete the selected files?")
    ap.add_argument("--kind", choices=["cross", "encoder", "decoder"], default="cross")
    ap.add_argument("--pair", help="SOURCE:TARGET (default the page's first)")
    ap.add_argument("--point", help="a source word to point at in the word alignment view")
    args = ap.parse_args()
    with chromium() as browser:
        page = browser.new_page(viewport=DESKTOP)
        open_explorer(page, args.url)
        if args.pair:
            page.select_option("#pair", args.pair)
        status, body = translate(page, args.text)
        if status != 200:
            raise SystemExit(f"POST /attention answered {status}: {body}")
        page.select_option("#kind", args.kind)
        if args.point:
            page.hover(f'#source-words .word:text-is("{args.point}")')
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
