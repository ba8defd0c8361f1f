"""Copies of the tiny random bundle under other language codes (its manifest edited; the manifest has no checksum),
for the tests of several pairs and of pivoting. No torch."""

from __future__ import annotations

import shutil
from pathlib import Path

from service.runtime.manifest import Manifest


def pair_bundle(tiny: Path, root: Path, source: str, target: str) -> Path:
    """The tiny bundle at ``root/tiny-<source>-<target>``, serving ``source``→``target``."""
    out = root / f"tiny-{source}-{target}"
    if not out.exists():
        shutil.copytree(tiny, out)
        manifest = Manifest.read(out)
        manifest.name, manifest.source_lang, manifest.target_lang = out.name, source, target
        manifest.write(out)
    return out
