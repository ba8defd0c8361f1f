"""What ``attnserve serve`` checks before it listens: the settings, every bundle (manifest, checksums, tokenizer and
their consistency) and the listening address. A failure is one :class:`StartupError` whose message names the
setting or file and says what to do; the command line prints it as one line and exits with code 2.

ONNX Runtime sessions are built after the server listens (service/http/app.py), so that /healthz answers while they
load; everything that can be checked without them is checked here, first.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from service.runtime.bundle import Bundle, BundleError, load_bundle
from service.serving.budget import MiB
from service.serving.catalog import disk_bytes, pairs_of
from service.settings import Settings

ENV_PREFIX = "ATTNSERVE_"


class StartupError(Exception):
    """A setting, bundle or address that stops start-up; the message names it and says what to do."""


def load_settings(overrides: Mapping[str, Any]) -> Settings:
    """The environment's settings with the command line's ``overrides``.

    Raises:
        StartupError: a setting is invalid; every invalid one is named with its variable.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings(**overrides)
    except ValidationError as e:
        raise StartupError(settings_message(e.errors())) from None
    except SettingsError as e:
        raise StartupError(f"invalid settings: {one_line(str(e))}; fix the ATTNSERVE_* variable it names") from None


def settings_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """Pydantic's errors of :class:`Settings` as one line: each variable, the value given and what is wrong."""
    parts = []
    for err in errors:
        message = str(err["msg"]).removeprefix("Value error, ")
        if err["loc"]:
            field = str(err["loc"][0])
            given = err.get("input")
            value = "" if isinstance(given, dict) else f"={given!r}"
            message = f"{ENV_PREFIX}{field.upper()}{value} ({field}): {message}"
        parts.append(one_line(message))
    return "invalid settings: " + "; ".join(parts) + " — fix the variables (service/settings.py documents each)"


def one_line(text: str) -> str:
    return " ".join(text.split())


def check(settings: Settings) -> list[Bundle]:
    """Every bundle of ``settings``, loaded, verified and checked against the settings and each other.

    Raises:
        StartupError: no bundle, an unknown provider, a missing, damaged or inconsistent bundle, the settings'
            graph variant missing from a bundle, or two bundles of one language pair.
    """
    from service.runtime.runner import ProviderError, choose_provider

    if not settings.bundles:
        raise StartupError(f"{ENV_PREFIX}BUNDLES is empty: name at least one bundle directory")
    try:
        choose_provider(settings.provider)
    except ProviderError as e:
        raise StartupError(str(e)) from None
    bundles = [check_bundle(path, settings) for path in settings.bundles]
    pairs: dict[tuple[str, str], Path] = {}
    for b in bundles:
        for pair in pairs_of(b.manifest):
            if pair in pairs:
                raise StartupError(
                    f"{b.path} and {pairs[pair]} both translate {'→'.join(pair)}: serve one bundle per pair "
                    f"({ENV_PREFIX}BUNDLES)"
                )
            pairs[pair] = b.path
        check_fits(b, settings)
    return bundles


def check_fits(bundle: Bundle, settings: Settings) -> None:
    """A bundle fits in ``models_memory_mb`` alone (else it could never load).

    Raises:
        StartupError: it does not.
    """
    size, bound = disk_bytes(bundle.path, bundle.manifest), settings.models_memory_mb * MiB
    if bound and size > bound:
        raise StartupError(
            f"{bundle.path}: its files take {-(-size // MiB)} MiB, more than {ENV_PREFIX}MODELS_MEMORY_MB="
            f"{settings.models_memory_mb}: raise it, or serve the bundle elsewhere"
        )


def check_bundle(path: Path, settings: Settings) -> Bundle:
    """One bundle, loaded (manifest, every file's sha256, tokenizer) and checked for consistency.

    Raises:
        StartupError: as :func:`check`, naming the bundle's file.
    """
    manifest = path / "manifest.json"
    if not path.is_dir():
        raise StartupError(f"{path}: no such bundle directory — check {ENV_PREFIX}BUNDLES (or --bundle)")
    try:
        bundle = load_bundle(path)
        consistent(bundle)
        for role in ("encoder", "decoder"):
            bundle.graph(role, settings.graph_variant)
    except BundleError as e:
        raise StartupError(f"{e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a manifest without a field it needs
        raise StartupError(
            f"{manifest}: malformed manifest ({type(e).__name__}: {one_line(str(e))}) — export the bundle again "
            "(`attnserve export`)"
        ) from None
    except (RuntimeError, OSError) as e:  # SentencePiece refused its model file
        raise StartupError(
            f"{path}: the tokenizer cannot be read ({one_line(str(e))}) — export the bundle again"
        ) from None
    return bundle


def consistent(bundle: Bundle) -> None:
    """The tokenizer's ids fit the model: every id it can produce, and the special ids, are in the vocabulary.

    Raises:
        BundleError: an id past ``vocab_size``.
    """
    spec, tok = bundle.spec, bundle.tokenizer
    where = f"{bundle.path / 'manifest.json'}: model.vocab_size={spec.vocab_size}"
    if tok.vocab is not None:
        sizes = {"tokenizer vocab": max(tok.vocab.values(), default=-1) + 1}
    else:
        sizes = {"source tokenizer": tok.source.get_piece_size(), "target tokenizer": tok.target.get_piece_size()}
    for name, size in sizes.items():
        if size > spec.vocab_size:
            raise BundleError(f"{where}, but the {name} has {size} pieces — the files do not belong together")
    for name in ("pad_id", "eos_id", "unk_id", "decoder_start_id"):
        if not 0 <= getattr(spec, name) < spec.vocab_size:
            raise BundleError(f"{where}, but model.{name}={getattr(spec, name)} is outside it")


def bind(settings: Settings) -> socket.socket:
    """The listening socket on ``settings.host``:``settings.port``, bound before the server starts so that an
    address in use is a start-up error like any other.

    Raises:
        StartupError: the address cannot be bound.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((settings.host, settings.port))
    except OSError as e:
        sock.close()
        raise StartupError(
            f"cannot listen on {settings.host}:{settings.port} ({e.strerror or e}) — set {ENV_PREFIX}HOST / "
            f"{ENV_PREFIX}PORT (or --host / --port) to a free address of this machine"
        ) from None
    return sock
