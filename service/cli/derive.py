"""``attnserve derive DIR...``: a bundle's derived graphs (:mod:`service.runtime.derive`) written and verified now, as a
Docker image's build step does, rather than on first load."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from service.runtime.derive import derive_missing


def add_parser(sub: Any) -> None:
    """``attnserve derive DIR...``: derive the bundles' derived graphs now (a Docker image's build step)."""
    p = sub.add_parser("derive", help="derive a bundle's int8 graphs from its shipped ones, and verify them")
    p.add_argument("bundles", nargs="+", type=Path, help="bundle directories, or directories of bundles")
    p.add_argument("--force", action="store_true", help="derive them again even where they exist")


def main(args: Any) -> int:
    """Derive (every missing derived graph, or all with ``--force``) and verify each bundle of ``args.bundles``;
    print the files derived. Returns 0, or 2 with one line on stderr naming the file that is wrong."""
    from service.runtime.bundle import bundle_dirs, load_bundle

    for path in bundle_dirs(args.bundles):
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            for file in derive_missing(path, manifest, force=args.force):
                print(file)
            load_bundle(path)
        except json.JSONDecodeError as e:
            print(f"attnserve: {path / 'manifest.json'}: not valid JSON: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"attnserve: {path}: {e}", file=sys.stderr)
            return 2
        except ValueError as e:  # BundleError, DeriveError: each names its file
            print(f"attnserve: {e}", file=sys.stderr)
            return 2
    return 0
