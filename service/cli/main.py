"""``attnserve``: the service's subcommands (serve, translate, attention, translate-po, derive, models); the
model's are handed to model/cli.py only when called, so a service-only install (no torch) runs ``attnserve serve``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from service.cli import attention as attention_cli
from service.cli import derive as derive_cli
from service.cli import models as models_cli
from service.cli import translate_po

if TYPE_CHECKING:
    from service.settings import Settings

MODEL_COMMANDS = (
    "train", "average", "evaluate", "export", "import-marian", "import-argos", "export-marian", "calibrate"
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnserve",
        description="Machine translation with every attention weight. Model commands (need the 'train' extra): "
        + ", ".join(MODEL_COMMANDS)
        + " — see `attnserve train --help`.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve the HTTP API (settings: ATTNSERVE_* environment variables)")
    p.add_argument("--bundle", type=Path, action="append", help="bundle directory (repeat for several pairs)")
    p.add_argument("--host", default=None, help="listen address (default ATTNSERVE_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default ATTNSERVE_PORT or 8000)")

    p = sub.add_parser("translate", help="translate texts locally, no server")
    p.add_argument("text", nargs="+")
    p.add_argument(
        "--bundle", type=Path, default=None, help="bundle directory (default: the first bundle serving --target)"
    )
    p.add_argument("--beam-size", type=int, default=None, help="default: the settings' default_beam_size")
    p.add_argument("--target", default=None, help="target language (default: the first bundle's first)")
    p.add_argument("--json", action="store_true", help="print the texts as a JSON list")
    attention_cli.add_parser(sub)
    translate_po.add_parser(sub)
    derive_cli.add_parser(sub)
    models_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in MODEL_COMMANDS:
        model_cli = importlib.import_module("model.cli")
        return int(model_cli.main(argv))
    args = build_parser().parse_args(argv)
    if args.command == "derive":
        return derive_cli.main(args)
    from service.serving.startup import StartupError, load_settings

    overrides = {k: v for k, v in (("host", getattr(args, "host", None)), ("port", getattr(args, "port", None))) if v}
    if getattr(args, "bundle", None):
        overrides["bundles"] = args.bundle if isinstance(args.bundle, list) else [args.bundle]
    try:
        settings = load_settings(overrides)
    except StartupError as e:
        print(f"attnserve: {e}", file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(settings)
    if args.command == "translate-po":
        return translate_po.main(args, settings)
    if args.command == "models":
        return models_cli.main(args, settings)
    return local(args, settings)


def serve(settings: Settings) -> int:
    """Check the settings, the bundles and the address (one line on stderr and code 2 for what is wrong), then
    serve until SIGTERM has drained; 2 if start-up fails after listening (the log says why)."""
    import uvicorn

    from service.cli.server import Server
    from service.http.app import configure_logging, create_app
    from service.http.slow_clients import uvicorn_options
    from service.runtime.runner import tune_memory
    from service.serving.core_sharing import UNAVAILABLE, batch_scheduling
    from service.serving.startup import StartupError, bind, check

    configure_logging(settings)  # start-up logs each Argos package it imports or skips
    try:
        checked = check(settings)
        sock = bind(settings)
    except StartupError as e:
        print(f"attnserve: {e}", file=sys.stderr)
        return 2
    tune_memory()  # before any thread starts, so that every thread allocates from the one malloc arena it sets
    if settings.sched_batch == "always" and not batch_scheduling():  # before any thread starts: they inherit it
        print(f"attnserve: {UNAVAILABLE}", file=sys.stderr)
    app = create_app(settings, checked, on_fatal=lambda message: server.fail(message))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_graceful_shutdown=1,  # uvicorn's own shutdown comes after the drain: only 503s are left to send
        **uvicorn_options(settings, app),
    )
    server = Server(config, app.state.shutdown)
    server.run(sockets=[sock])
    return server.exit_code


def local(args: argparse.Namespace, settings: Settings) -> int:
    from service.errors import ServiceError
    from service.runtime.bundle import BundleError
    from service.serving.catalog import bundle_for
    from service.serving.engine import Engine
    from service.serving.translation import Options

    try:
        engine = Engine.load(bundle_for(settings.bundle_paths(), target=args.target), settings, args.target)
        if args.command == "attention":
            return attention_cli.main(args, engine)
        texts = [t.text for t in engine.translate_now(args.text, Options(beam_size=args.beam_size))]
        print(json.dumps(texts, ensure_ascii=False) if args.json else "\n".join(texts))
        return 0
    except (BundleError, ServiceError) as e:
        print(f"attnserve: {e}", file=sys.stderr)
        return 2
