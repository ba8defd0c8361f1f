"""Copies of the tiny random bundle under other language codes (its manifest edited; the manifest has no checksum),
for the tests of several pairs and of pivoting. No torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def pair_bundle(tiny: Path, root: Path, source: str, target: str) -> Path:
    """The tiny bundle at ``root/tiny-<source>-<target>``, serving ``source``→``target``."""
    out = root / f"tiny-{source}-{target}"
    if not out.exists():
        shutil.copytree(tiny, out)
        manifest = json.loads((out / "manifest.json").read_text())
        manifest.update(name=out.name, source_lang=source, target_lang=target)
        (out / "manifest.json").write_text(json.dumps(manifest))
    return out
