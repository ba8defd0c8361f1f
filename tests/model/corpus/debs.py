"""Tiny gettext catalogs and .deb files for the corpus tests."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest


def write_mo(entries: list[tuple[str, str]], charset: str = "UTF-8") -> bytes:
    """The GNU .mo binary format for (key, value) strings, as msgfmt writes it (no hash table).

    Keys are ``msgid``, ``ctx\\x04msgid`` or ``msgid\\x00msgid_plural``; values join plural forms with ``\\x00``.
    """
    header = f"Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
    items = sorted([("", header), *entries], key=lambda kv: kv[0].encode(charset))
    keys = [k.encode(charset) for k, _ in items]
    values = [v.encode(charset) for _, v in items]
    n = len(items)
    orig_table, trans_table = 28, 28 + 8 * n
    offset = 28 + 16 * n
    key_offsets: list[tuple[int, int]] = []
    value_offsets: list[tuple[int, int]] = []
    blob = b""
    for data, offsets in [(k, key_offsets) for k in keys] + [(v, value_offsets) for v in values]:
        offsets.append((len(data), offset + len(blob)))
        blob += data + b"\x00"
    out = struct.pack("<7I", 0x950412DE, 0, n, orig_table, trans_table, 0, offset)
    for length, start in key_offsets + value_offsets:
        out += struct.pack("<2I", length, start)
    return out + blob


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")


def make_deb(root: Path, out_dir: Path, package: str, files: dict[str, bytes], links: dict[str, str]) -> Path:
    """Build a tiny .deb holding ``files`` (path → bytes) and symbolic ``links`` (path → target)."""
    tree = root / package
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: Test <t@example.org>\nDescription: x\n"
    )
    for path, data in files.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(data)
    for path, target in links.items():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).symlink_to(target)
    deb = out_dir / f"{package}_1.0-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(deb)], check=True, capture_output=True
    )
    return deb
