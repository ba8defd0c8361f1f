"""A LibreTranslate installation's Argos Translate packages, served as bundles imported once into a cache.

A packages directory holds one unpacked package a folder (argos-translate's layout: ``metadata.json``,
``sentencepiece.model``, ``model/``). Each package's bundle lives in the cache under ``<folder>-<key>``, the key a hash
of the package's file names and bytes and of the bundle format, so a changed package (or a version of attnserve that
writes another format) gets a bundle of its own and an unchanged one is never imported twice. Importing is the model's
side (``attnserve import-argos``, torch-free): :func:`sync` takes the importer as a callable, so the model's one-shot
command imports in its process and ``attnserve serve`` in a subprocess (:func:`subprocess_importer`), and an
installation without the importer serves what the cache holds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.runtime.bundle import FORMAT
from service.runtime.manifest import is_bundle

log = logging.getLogger(__name__)

KEY_CHARS = 16  # of the sha256's hex digits in a cache entry's name
CHUNK = 1 << 20
MAX_METADATA_BYTES = 1 << 20
IMPORT_TIMEOUT_S = 3600  # one package's import in a subprocess; a hung importer must not hold start-up for good
# The one-package import run in a subprocess: a module path, never imported here (service/ never imports model/).
IMPORTER_MODULE = "model.importers.argos_cache"

State = Literal["imported", "cached", "refused", "unreadable", "not imported", "broken", "shadowed"]
SERVED: tuple[State, ...] = ("imported", "cached")


class ImportRefused(Exception):
    """The importer refused a package; the message is its one-line reason."""


Importer = Callable[[Path, Path, str], None]  # (package folder, bundle directory to write, bundle name)


@dataclass(frozen=True)
class Package:
    """One package folder: its languages from metadata.json and its content key."""

    folder: Path
    source: str
    target: str
    key: str

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def entry(self) -> str:
        """Its bundle's directory name in the cache."""
        return f"{self.name}-{self.key[:KEY_CHARS]}"


@dataclass(frozen=True)
class Outcome:
    """What became of one package folder: its bundle in the cache (``imported`` now, or ``cached`` before), or
    why it is not served (``refused`` by the importer, ``unreadable`` metadata, ``not imported``: no importer
    here; at start-up, ``broken``: its bundle fails the checks, ``shadowed``: another bundle serves its pair)."""

    folder: Path
    state: State
    pair: tuple[str, str] | None = None
    bundle: Path | None = None
    reason: str = ""

    @property
    def served(self) -> bool:
        return self.state in SERVED


def argos_packages_dir(env: Mapping[str, str] = os.environ) -> Path:
    """argos-translate's packages directory, as its settings.py finds it: ``$ARGOS_PACKAGES_DIR``, else the
    deprecated ``$ARGOS_TRANSLATE_PACKAGES_DIR``, else ``argos-translate/packages`` under ``$XDG_DATA_HOME``
    (default ``~/.local/share``; a snap's home is ``$SNAP_USER_DATA``)."""
    for name in ("ARGOS_PACKAGES_DIR", "ARGOS_TRANSLATE_PACKAGES_DIR"):
        if env.get(name):
            return Path(env[name])
    home = Path(env["SNAP_USER_DATA"]) if "SNAP" in env and env.get("SNAP_USER_DATA") else Path.home()
    data = Path(env["XDG_DATA_HOME"]) if env.get("XDG_DATA_HOME") else home / ".local" / "share"
    return data / "argos-translate" / "packages"


def default_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``attnserve/argos`` under ``$XDG_CACHE_HOME`` (default ``~/.cache``)."""
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "attnserve" / "argos"


def content_key(folder: Path) -> str:
    """sha256 of the bundle format and of every file under ``folder``: its path relative to the folder, its size and
    its bytes, in order."""
    digest = hashlib.sha256(FORMAT.encode() + b"\0")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.stat().st_size.to_bytes(8, "little"))
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def read_package(folder: Path) -> Package:
    """A package folder's languages and key.

    Raises:
        ImportRefused: no readable metadata.json with ``from_code`` and ``to_code``, or not a translation package.
    """
    meta_path = folder / "metadata.json"
    try:
        if meta_path.stat().st_size > MAX_METADATA_BYTES:
            raise ImportRefused(f"metadata.json is larger than {MAX_METADATA_BYTES} bytes")
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ImportRefused("no metadata.json: not an Argos package folder") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ImportRefused(f"metadata.json cannot be read: {' '.join(str(e).split())}") from None
    if not isinstance(meta, dict):
        raise ImportRefused(f"metadata.json holds a {type(meta).__name__}, expected an object")
    if meta.get("type", "translate") != "translate":
        raise ImportRefused(f"metadata.json: type {meta.get('type')!r}, not a translation package")
    codes = [meta.get("from_code"), meta.get("to_code")]
    if not all(isinstance(c, str) and c for c in codes):
        raise ImportRefused(f"metadata.json: from_code {codes[0]!r}, to_code {codes[1]!r} are not language codes")
    return Package(folder, str(codes[0]), str(codes[1]), content_key(folder))


def package_folders(directory: Path) -> list[Path]:
    """The package folders in ``directory`` (each subfolder, as argos-translate lists them), by name; hidden ones
    left out."""
    return sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))


def failure_file(cache: Path, package: Package) -> Path:
    """Where the importer's last refusal of this content is kept, for servers that cannot import."""
    return cache / f"{package.entry}.refused"


def sync(directory: Path, cache: Path, importer: Importer | None) -> list[Outcome]:
    """Every package of ``directory`` with its bundle in ``cache``, importing those the cache lacks with
    ``importer`` (none: they stay ``not imported``). One package's failure never stops the others.

    Raises:
        OSError: ``directory`` cannot be listed.
    """
    outcomes = []
    for folder in package_folders(directory):
        try:
            package = read_package(folder)
        except (ImportRefused, OSError) as e:
            outcomes.append(Outcome(folder, "unreadable", reason=str(e)))
            continue
        outcomes.append(bring_in(package, cache, importer))
    return outcomes


def missing_reason(directory: Path, cache: Path) -> str:
    """Why a package without a bundle in the cache stays so where the importer cannot run."""
    return (
        f"no bundle in {cache}, and the importer (the model package and onnx) is not installed here: run "
        f"`attnserve import-argos --packages {directory} --cache {cache}` where it is (docs/DEPLOY.md)"
    )


def bring_in(package: Package, cache: Path, importer: Importer | None) -> Outcome:
    """One package's bundle: the cache's, or imported into it (written beside, then renamed: readers and other
    importers never see half a bundle)."""
    pair, bundle = (package.source, package.target), cache / package.entry
    if is_bundle(bundle):
        return Outcome(package.folder, "cached", pair, bundle)
    refused = failure_file(cache, package)
    if importer is None:
        if refused.is_file():
            return Outcome(package.folder, "refused", pair, reason=refused.read_text().strip())
        return Outcome(package.folder, "not imported", pair, reason=missing_reason(package.folder.parent, cache))
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".{package.entry}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        importer(package.folder, partial, package.name)
        if bundle.exists() and not is_bundle(bundle):  # an unfinished copy's remains
            shutil.rmtree(bundle)
        os.replace(partial, bundle)
    except ImportRefused as e:
        refused.write_text(f"{e}\n")
        return Outcome(package.folder, "refused", pair, reason=str(e))
    except OSError:  # another importer renamed its copy first
        if not is_bundle(bundle):
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    refused.unlink(missing_ok=True)
    return Outcome(package.folder, "imported", pair, bundle)


def importer_here() -> bool:
    """Whether this installation can import packages: the model's importer (model/importers/argos.py, which builds
    the graphs without torch) and onnx are installed, as in every install from this repository."""
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "model"))


def subprocess_importer(folder: Path, out: Path, name: str) -> None:
    """Import one package in a subprocess (the import's memory is returned when it ends, and a crash in it leaves
    the server running).

    Raises:
        ImportRefused: the importer's one-line reason, or how it failed.
    """
    command = [sys.executable, "-m", IMPORTER_MODULE, str(folder), str(out), name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise ImportRefused(f"the import took more than {IMPORT_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise ImportRefused(lines[-1].strip() if lines else f"the importer exited with {done.returncode}")
