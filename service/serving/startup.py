"""What ``attnserve serve`` checks before it listens: the settings, every bundle (manifest, checksums, tokenizer and
their consistency) and the listening address. A failure is one :class:`StartupError` whose message names the
setting or file and says what to do; the command line prints it as one line and exits with code 2.

ONNX Runtime sessions are built after the server listens (service/http/app.py), so that /healthz answers while they
load; everything that can be checked without them is checked here, first.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.runtime.bundle import Bundle, BundleError, load_bundle
from service.runtime.manifest import MANIFEST
from service.serving import packages
from service.serving.budget import MiB
from service.serving.catalog import Pair, footprint, pairs_of, pivots, readable_pairs
from service.settings import Settings

ENV_PREFIX = "ATTNSERVE_"
log = logging.getLogger("attnserve")


@dataclass(frozen=True)
class Shadowed:
    """A shipped bundle not served: the user's bundle or package at ``by`` serves its ``pair``."""

    path: Path
    pair: Pair
    by: Path


@dataclass(frozen=True)
class Checked:
    """What start-up serves: the checked bundles (``BUNDLES``' then the packages'), what became of each package
    folder (skipped ones with their reason), the shipped bundles that the user's models shadow, and why each bundle
    of ``BUNDLES`` that cannot be served is refused (start-up stops on the first; a reload skips them)."""

    bundles: list[Bundle]
    packages: list[packages.Outcome] = dataclasses.field(default_factory=list)
    shadowed: list[Shadowed] = dataclasses.field(default_factory=list)
    refused: list[str] = dataclasses.field(default_factory=list)


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


def check(settings: Settings) -> Checked:
    """Every bundle of ``settings``, loaded, verified and checked against the settings and each other; then the
    packages directory's bundles (imported first where the importer runs), a package that cannot be served skipped
    and logged in one line; a shipped bundle whose pair the user's models serve is shadowed (:func:`survey`).

    Raises:
        StartupError: nothing to serve, an unknown provider, a missing, damaged or inconsistent bundle, the settings'
            graph variant missing from a bundle, two bundles of one language pair, a packages directory that
            cannot be listed, or decoding defaults of a pair not served.
    """
    from service.runtime.providers import ProviderError, choose_provider

    try:
        choose_provider(settings.provider)
    except ProviderError as e:
        raise StartupError(str(e)) from None
    checked = survey(settings)
    if checked.refused:
        raise StartupError(checked.refused[0])
    if not checked.bundles:
        raise StartupError(
            f"nothing to serve: {ENV_PREFIX}BUNDLES is empty and no Argos package could be served — name at least "
            f"one bundle directory, or set {ENV_PREFIX}ARGOS_PACKAGES to a directory of packages (the log names each)"
        )
    check_pair_defaults(settings, [p for b in checked.bundles for p in pairs_of(b.manifest)])
    return checked


def survey(settings: Settings, known: Mapping[Path, Bundle] | None = None) -> Checked:
    """What ``settings`` serve now, by precedence: the user's bundles (``BUNDLES`` outside ``shipped_bundles``),
    then the packages, then the shipped bundles, each pair from the first that serves it; a shipped bundle whose
    pair is taken is shadowed (logged), a package shadowed by a bundle skipped. ``known``: bundles already checked,
    by path, not read again (a reload's).

    Raises:
        StartupError: the packages directory, named explicitly, cannot be listed.
    """
    known = known or {}
    paths = settings.served_bundles()
    shipped = [p for p in paths if settings.is_shipped(p)]
    pairs: dict[Pair, Path] = {}  # each served pair's bundle
    served: dict[Path, Bundle] = {}
    refused: list[str] = []
    for path in [p for p in paths if p not in shipped]:
        admit_bundle(path, settings, known, pairs, served, refused)
    outcomes, from_packages = [], []
    for outcome in package_outcomes(settings):
        bundle, outcome = admit(outcome, settings, pairs, known)
        outcomes.append(outcome)
        if bundle is not None:
            from_packages.append(bundle)
    shadowed = []
    for path in shipped:
        taken = [p for p in readable_pairs(path) if p in pairs and not settings.is_shipped(pairs[p])]
        if taken:
            shadowed.append(Shadowed(path, taken[0], pairs[taken[0]]))
            log.warning(
                "%s: shadowed, not served: %s, the user's, serves %s", path, pairs[taken[0]], "→".join(taken[0])
            )
            continue
        admit_bundle(path, settings, known, pairs, served, refused)
    bundles = [served[p] for p in paths if p in served] + from_packages
    return Checked(bundles, outcomes, shadowed, refused)


def admit_bundle(
    path: Path,
    settings: Settings,
    known: Mapping[Path, Bundle],
    pairs: dict[Pair, Path],
    served: dict[Path, Bundle],
    refused: list[str],
) -> None:
    """One bundle of ``BUNDLES``, checked (or ``known``) and added to ``served`` and ``pairs``; or why not, added
    to ``refused``."""
    try:
        bundle = known[path] if path in known else check_bundle(path, settings)
        check_fits(bundle, settings)
    except StartupError as e:
        refused.append(str(e))
        return
    taken = [p for p in pairs_of(bundle.manifest) if p in pairs]
    if taken:
        refused.append(
            f"{bundle.path} and {pairs[taken[0]]} both translate {'→'.join(taken[0])}: serve one bundle per pair "
            f"({ENV_PREFIX}BUNDLES)"
        )
        return
    pairs.update(dict.fromkeys(pairs_of(bundle.manifest), bundle.path))
    served[path] = bundle


def check_pair_defaults(settings: Settings, direct: list[Pair]) -> None:
    """Every key of ``pair_defaults`` is a pair served, directly or through the pivot language.

    Raises:
        StartupError: naming the keys that are not, and the pairs that are.
    """
    served = [*direct, *(p.pair for p in pivots(direct, settings.pivot_language))]
    names = ["-".join(p) for p in served]
    unknown = [k for k in settings.pair_defaults if k not in names]
    if unknown:
        raise StartupError(
            f"{ENV_PREFIX}PAIR_DEFAULTS names {', '.join(repr(k) for k in unknown)}, which this server does not "
            f"serve; it serves {', '.join(names)}: key each entry by a served pair, source-target"
        )


def package_outcomes(settings: Settings) -> list[packages.Outcome]:
    """The packages directory's packages with their bundles in ``argos_cache``, those missing imported (in a
    subprocess) where this installation has the importer.

    Raises:
        StartupError: the directory, named explicitly, cannot be listed.
    """
    directory = settings.packages_dir()
    if directory is None:
        return []
    importer = logged_import if packages.importer_here() else None
    try:
        return packages.sync(directory, settings.argos_cache, importer)
    except OSError as e:
        raise StartupError(
            f"{directory}: cannot read the packages directory ({e.strerror or e}) — check {ENV_PREFIX}ARGOS_PACKAGES"
        ) from None


def logged_import(folder: Path, out: Path, name: str) -> None:
    """:func:`packages.subprocess_importer`, announced: an import takes seconds to minutes."""
    log.info("argos package %s: importing into the cache (once for this content)", name)
    packages.subprocess_importer(folder, out, name)


def admit(
    outcome: packages.Outcome, settings: Settings, pairs: dict[Pair, Path], known: Mapping[Path, Bundle]
) -> tuple[Bundle | None, packages.Outcome]:
    """A package's bundle checked as any bundle (or ``known``), its pairs added to ``pairs``; or None and the
    outcome saying why it is skipped (logged in one line)."""
    bundle = None
    if outcome.bundle is not None:
        try:
            bundle = known[outcome.bundle] if outcome.bundle in known else check_bundle(outcome.bundle, settings)
            taken = [p for p in pairs_of(bundle.manifest) if p in pairs]
            if taken:
                reason = f"{'→'.join(taken[0])} is served by {pairs[taken[0]]}"
                outcome, bundle = dataclasses.replace(outcome, state="shadowed", reason=reason), None
            else:
                check_fits(bundle, settings)
        except StartupError as e:
            outcome, bundle = dataclasses.replace(outcome, state="broken", reason=str(e)), None
    pair = "→".join(outcome.pair) if outcome.pair else "?"
    if bundle is None:
        log.warning("argos package %s (%s): skipped, %s: %s", outcome.folder, pair, outcome.state, outcome.reason)
        return None, outcome
    pairs.update(dict.fromkeys(pairs_of(bundle.manifest), bundle.path))
    log.info("argos package %s (%s): %s, %s", outcome.folder.name, pair, outcome.state, bundle.path)
    return bundle, outcome


def check_fits(bundle: Bundle, settings: Settings) -> None:
    """A bundle fits in ``models_memory_mb`` alone (else it could never load); its footprint is read only here and
    cached (service/serving/catalog.py), so the registry's reads cost start-up nothing more.

    Raises:
        StartupError: it does not, or its graphs cannot be read.
    """
    bound = settings.models_memory_mb * MiB
    if not bound:
        return
    try:
        size = footprint(bundle, settings.graph_variant)
    except (OSError, ValueError) as e:
        raise StartupError(f"{bundle.path}: its graphs cannot be read: {e}") from None
    if size > bound:
        raise StartupError(
            f"{bundle.path}: its weights take {-(-size // MiB)} MiB loaded, more than {ENV_PREFIX}MODELS_MEMORY_MB="
            f"{settings.models_memory_mb}: raise it, or serve the bundle elsewhere"
        )


def check_bundle(path: Path, settings: Settings) -> Bundle:
    """One bundle, loaded (manifest, every file's sha256, tokenizer) and checked for consistency.

    Raises:
        StartupError: as :func:`check`, naming the bundle's file.
    """
    manifest = path / MANIFEST
    if not path.is_dir():
        raise StartupError(f"{path}: no such bundle directory — check {ENV_PREFIX}BUNDLES (or --bundle)")
    try:
        bundle = load_bundle(path)
        consistent(bundle)
        for role in ("encoder", "decoder"):
            bundle.graph(role, bundle.served_variant(settings.graph_variant))
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
    where = f"{bundle.path / MANIFEST}: model.vocab_size={spec.vocab_size}"
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
