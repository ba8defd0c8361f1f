"""``attnserve derive DIR...``: a bundle's int8 graphs (:mod:`service.runtime.derive`) written and verified now, as a
Docker image's build step does, rather than on first load; a float32 bundle without them (an imported one) gets
them. Every bundle gets a line: the graphs derived, or why there was nothing to derive."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from service.runtime.derive import add_int8, derive_missing
from service.runtime.manifest import Manifest


def add_parser(sub: Any) -> None:
    """``attnserve derive DIR...``: derive the bundles' int8 graphs now (a Docker image's build step)."""
    p = sub.add_parser("derive", help="derive a bundle's int8 graphs from its shipped ones, and verify them")
    p.add_argument("bundles", nargs="+", type=Path, help="bundle directories, or directories of bundles")
    p.add_argument("--force", action="store_true", help="derive them again even where they exist")


def derive(path: Path, force: bool) -> list[str]:
    """What ``attnserve derive`` does to one bundle, as the lines it prints.

    Raises:
        ManifestError, DeriveError, BundleError, OSError: as their messages say.
    """
    from service.runtime.bundle import load_bundle

    manifest = Manifest.read(path)
    if "int8" not in manifest.variants:
        derived = add_int8(path)
        manifest = Manifest.read(path)
    else:
        derived = derive_missing(path, manifest, force=force)
    load_bundle(path)
    if derived:
        return [f"{file} (from {manifest.derived[file.name]['from']})" for file in derived]
    int8 = manifest.graphs["int8"].values()
    listed = ", ".join(sorted(int8))
    if set(int8) <= set(manifest.derived):
        return [f"{path}: nothing to derive: its int8 graphs ({listed}) are there (--force derives them again)"]
    return [f"{path}: nothing to derive: its int8 graphs ({listed}) are shipped"]


def main(args: Any) -> int:
    """Derive (every missing int8 graph, every one with ``--force``, or a float32 bundle's int8 variant) and verify
    each bundle of ``args.bundles``; print what was derived. Returns 0, or 2 with one line on stderr naming the file
    that is wrong or why a bundle cannot have int8 graphs."""
    from service.runtime.bundle import bundle_dirs

    for path in bundle_dirs(args.bundles):
        try:
            lines = derive(path, args.force)
        except OSError as e:
            print(f"attnserve: {path}: {e}", file=sys.stderr)
            return 2
        except ValueError as e:  # ManifestError, BundleError, DeriveError: each names its file
            print(f"attnserve: {e}", file=sys.stderr)
            return 2
        print("\n".join(lines))
    return 0
