"""Translated files waiting to be downloaded: one directory, random names that cannot leave it, and an expiry."""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from service.errors import NoSuchFile

_NAME_RE = re.compile(r"[0-9a-f]{32}_[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a token, then the upload's safe name
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(filename: str) -> str:
    """An upload's file name reduced to its last part in ``[A-Za-z0-9._-]``, at most 100 characters, its extension
    kept, as the download offers it (``file`` and the extension when nothing else is left)."""
    stem, ext = os.path.splitext(PureWindowsPath(PurePosixPath(filename).name).name)
    ext = "." + _UNSAFE_RE.sub("", ext[1:])[:19] if ext else ""
    stem = _UNSAFE_RE.sub("_", stem).strip("._-")[: 100 - len(ext)]
    return (stem or "file") + (ext if len(ext) > 1 else "")


@dataclass(frozen=True)
class StoredFile:
    """A stored file: where it is and the name it is downloaded as (the upload's)."""

    path: Path
    download_name: str


class FileStore:
    """Files under ``directory`` (made on first use, readable by this user only), each deleted ``ttl_s`` seconds
    after it was written. Expired files are swept whenever a file is stored, and a download of one deletes it."""

    def __init__(self, directory: Path, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self.clock = clock

    def save(self, data: bytes, filename: str) -> str:
        """Store ``data`` under a new random name that ends with ``filename``'s :func:`safe_name`; returns it."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sweep()
        name = f"{secrets.token_hex(16)}_{safe_name(filename)}"
        partial = self.directory / f".{name}.part"
        partial.write_bytes(data)
        os.utime(partial, (self.clock(), self.clock()))
        partial.replace(self.directory / name)  # a download never sees half a file
        return name

    def open(self, name: str) -> StoredFile:
        """The stored file called ``name``.

        Raises:
            NoSuchFile: no such name was given out (any other name, ``../`` and slashes included), or it expired
                (and is deleted now).
        """
        missing = NoSuchFile(f"no translated file {name!r}: it never existed or it expired after {self.ttl_s:g} s")
        if _NAME_RE.fullmatch(name) is None:
            raise missing
        path = self.directory / name
        try:
            written = path.stat().st_mtime
        except OSError:
            raise missing from None
        if self.clock() - written >= self.ttl_s:
            path.unlink(missing_ok=True)
            raise missing
        return StoredFile(path, name.split("_", 1)[1])

    def sweep(self) -> int:
        """Delete every expired file (half-written ones too); returns how many."""
        now, swept = self.clock(), 0
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return 0
        for entry in entries:
            name = entry.name.removeprefix(".").removesuffix(".part")
            if _NAME_RE.fullmatch(name) is None:
                continue  # not this store's: never delete what it did not write
            try:
                if now - entry.stat().st_mtime >= self.ttl_s:
                    os.unlink(entry.path)
                    swept += 1
            except FileNotFoundError:
                continue  # swept by another worker
        return swept
