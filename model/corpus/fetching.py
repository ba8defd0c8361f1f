"""Fetching the Debian packages (``apt-get download``) and finding the downloaded ``.deb`` files."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable
from pathlib import Path

LOG = logging.getLogger(__name__)


def package_of(deb_name: str) -> str:
    """The package name of a .deb file name as ``apt-get download`` writes it (``name_version_arch.deb``)."""
    return deb_name.split("_", 1)[0]


def find_debs(debs_dir: Path) -> list[Path]:
    """The .deb files in a directory, one per package (the last file name in sorted order when there are several)."""
    by_package: dict[str, Path] = {}
    for deb in sorted(debs_dir.glob("*.deb")):
        package = package_of(deb.name)
        if package in by_package:
            LOG.warning("several .debs for %s; using %s, not %s", package, deb.name, by_package[package].name)
        by_package[package] = deb
    return [by_package[package] for package in sorted(by_package)]


def read_package_list(path: Path) -> list[str]:
    """Package names from a file with one per line (blank lines and ``#`` comments are ignored)."""
    names = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return sorted({name for name in names if name})


def download_debs(packages: Iterable[str], debs_dir: Path) -> list[str]:
    """Run ``apt-get download`` in ``debs_dir`` for the packages that have no .deb there yet.

    Args:
        packages: Package names.
        debs_dir: The cache directory; created if missing.

    Returns:
        The packages that are still missing afterwards (apt could not find them).
    """
    debs_dir.mkdir(parents=True, exist_ok=True)
    have = {package_of(deb.name) for deb in debs_dir.glob("*.deb")}
    missing = sorted(set(packages) - have)
    if missing:
        LOG.info("downloading %d packages into %s", len(missing), debs_dir)
        if subprocess.run(["apt-get", "download", *missing], cwd=debs_dir).returncode != 0:
            for package in missing:  # one unknown name fails the whole command: retry one by one
                if not list(debs_dir.glob(f"{package}_*.deb")):
                    subprocess.run(["apt-get", "download", package], cwd=debs_dir)
    have = {package_of(deb.name) for deb in debs_dir.glob("*.deb")}
    still_missing = sorted(set(packages) - have)
    if still_missing:
        LOG.warning("could not download: %s", ", ".join(still_missing))
    return still_missing
