"""``attnserve translate-po IN.po -o OUT.po --source en --target ja``: a gettext catalog's empty msgstrs filled, by
the service's own engine in this process (default) or by a running server (``--url``), in batches, with a progress
bar (service/formats/po.py does the catalog's part)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import ServiceError, TooLarge
from service.formats.base import Translate, TranslateBatch, batched

if TYPE_CHECKING:
    from service.formats.po import Report
    from service.settings import Settings


class RemoteError(ServiceError):
    """The server refused a batch (its error message), or could not be reached."""


def add_parser(sub: Any) -> None:
    """Add the ``translate-po`` subcommand to ``attnserve``'s subparsers."""
    p = sub.add_parser("translate-po", help="fill a gettext catalog's empty msgstrs (locally, or through --url)")
    p.add_argument("catalog", type=Path, help="the .po or .pot file to translate")
    p.add_argument("-o", "--output", type=Path, required=True, help="where to write the translated catalog")
    p.add_argument("--source", default="en", help="source language (default en)")
    p.add_argument("--target", required=True, help="target language, e.g. ja")
    p.add_argument("--url", default=None, help="a running attnserve (or LibreTranslate) server; default: decode here")
    p.add_argument("--api-key", default=None, help="the server's API key, with --url")
    p.add_argument(
        "--bundle", type=Path, default=None, help="bundle directory without --url (default: one serving the pair)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="texts a batch (default 32)")
    p.add_argument("--beam-size", type=int, default=None, help="default: the server's")
    p.add_argument("--no-fuzzy", action="store_true", help="do not mark filled entries fuzzy")


def local_batch(args: argparse.Namespace, settings: Settings) -> TranslateBatch:
    """The engine of the settings' first bundle that serves ``--source`` → ``--target``, loaded here, translating
    batch by batch.

    Raises:
        BundleError: the bundle cannot be loaded.
        RemoteError: it does not translate ``--source`` into ``--target``.
    """
    from service.serving.catalog import bundle_for
    from service.serving.engine import Engine
    from service.serving.translation import Options

    engine = Engine.load(bundle_for(settings.bundle_paths(), args.source, args.target), settings)
    if args.target in engine.bundle.targets:
        engine = engine.for_target(args.target)
    if engine.pair != (args.source, args.target):
        have = "→".join(engine.pair)
        raise RemoteError(f"the bundle translates {have}, not {args.source}→{args.target}; pick one with --bundle")
    options = Options(beam_size=args.beam_size)

    async def call(texts: list[str]) -> list[str]:
        return [t.text for t in engine.translate_now(texts, options)]

    return call


def remote_batch(args: argparse.Namespace, client: Any) -> TranslateBatch:
    """POST /translate on ``--url`` (httpx), a batch a request; a 413 is TooLarge, other refusals RemoteError."""
    import httpx

    async def call(texts: list[str]) -> list[str]:
        body: dict[str, Any] = {"q": texts, "source": args.source, "target": args.target, "format": "text"}
        if args.api_key:
            body["api_key"] = args.api_key
        if args.beam_size is not None:
            body["beam_size"] = args.beam_size
        try:
            response = await client.post("/translate", json=body)
        except httpx.HTTPError as e:
            raise RemoteError(f"{args.url}: {e}") from e
        if response.status_code == 413:
            raise TooLarge(_message(response), "server", 0)  # the server names its limit in the message
        if response.status_code != 200:
            raise RemoteError(f"{args.url} answered {response.status_code}: {_message(response)}")
        translated = response.json().get("translatedText")
        if not isinstance(translated, list) or len(translated) != len(texts):
            raise RemoteError(f"{args.url} answered no list of {len(texts)} translations: {response.text[:200]}")
        return [str(t) for t in translated]

    return call


def _message(response: Any) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return str(response.text[:200])


def main(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``translate-po``; 0 when the catalog was written, 2 with a message when it could not be."""
    from service.runtime.bundle import BundleError

    try:
        data = args.catalog.read_bytes()
    except OSError as e:
        print(f"attnserve: cannot read {args.catalog}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        out, report = asyncio.run(translate(data, args, settings))
    except (BundleError, ServiceError) as e:
        print(f"attnserve: {e}", file=sys.stderr)
        return 2
    args.output.write_bytes(out)
    kept = f", {report.kept_source} kept the English source as a directive was lost" if report.kept_source else ""
    over = f", {report.over_limit} kept a line over a limit in English" if report.over_limit else ""
    print(f"filled {report.filled} msgstr{kept}{over} (those marked fuzzy); wrote {args.output}", file=sys.stderr)
    return 0


async def translate(data: bytes, args: argparse.Namespace, settings: Settings) -> tuple[bytes, Report]:
    """The translated catalog's bytes and what was filled.

    Raises:
        UnreadableFile: the file is not a catalog, or one of another language.
        BundleError, RemoteError: as :func:`local_batch` and :func:`remote_batch`.
    """
    import httpx
    from tqdm import tqdm

    from service.formats import po

    catalog = po.parse(data)
    fuzzy = not args.no_fuzzy
    with tqdm(unit="text", desc=args.catalog.name, file=sys.stderr, disable=None) as bar:

        def with_bar(call: TranslateBatch) -> Translate:
            async def run(texts: list[str]) -> list[str | None]:
                bar.reset(total=len(texts))
                return await batched(call, args.batch_size, bar.update)(texts)

            return run

        if args.url is None:
            report = await po.translate_catalog(catalog, with_bar(local_batch(args, settings)), args.target, fuzzy)
        else:
            async with httpx.AsyncClient(base_url=args.url.rstrip("/"), timeout=120) as client:
                call = remote_batch(args, client)
                report = await po.translate_catalog(catalog, with_bar(call), args.target, fuzzy)
    return str(catalog).encode("utf-8"), report
