"""A packages directory imported into the cache that ``attnserve serve`` reads (service/serving/packages.py):
``attnserve import-argos --packages DIR --cache CACHE``, which fills a cache ahead of the servers.
``python -m model.importers.argos_cache FOLDER OUT NAME`` imports one package: what ``attnserve serve`` runs in a
subprocess for each package its cache lacks.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from service.serving.packages import ImportRefused, Outcome, sync

log = logging.getLogger("attnserve")


def import_one(folder: Path, out: Path, name: str) -> None:
    """One package folder as a bundle at ``out`` named ``name``.

    Raises:
        ImportRefused: any failure, as one line (a broken package must not stop the others).
    """
    from model.importers.argos import import_argos

    try:
        import_argos(folder, out, name=name)
    except Exception as e:  # a refusal (ValueError) or a package that breaks the export: one line either way
        message = " ".join(str(e).split())
        raise ImportRefused(message if isinstance(e, ValueError) else f"{type(e).__name__}: {message}") from None


def import_packages(directory: Path, cache: Path) -> list[Outcome]:
    """Every package of ``directory`` with a bundle in ``cache`` (imported when missing), each logged in one line.

    Raises:
        FileNotFoundError: ``directory`` is not a directory.
    """
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such packages directory")
    outcomes = sync(directory, cache, import_one)
    for o in outcomes:
        pair = "→".join(o.pair) if o.pair else "?"
        if o.served:
            log.info("argos package %s (%s): %s, %s", o.folder.name, pair, o.state, o.bundle)
        else:
            log.warning("argos package %s (%s): skipped, %s: %s", o.folder.name, pair, o.state, o.reason)
    served = sum(o.served for o in outcomes)
    log.info("%d of %d packages in %s have a bundle in %s", served, len(outcomes), directory, cache)
    return outcomes


def main(argv: list[str]) -> int:
    """``FOLDER OUT NAME``: 0 once written; 2 with the reason as stderr's one line."""
    folder, out, name = argv
    try:
        import_one(Path(folder), Path(out), name)
    except ImportRefused as e:
        sys.stderr.write(f"{e}\n")  # the one line the server reads back
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
