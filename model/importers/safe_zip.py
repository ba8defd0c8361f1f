"""Unpacking a zip from the internet into one directory: no entry leaves it, and the size is bounded.

Entries that climb out (``..``, absolute paths, drive letters), symlinks and other special files are refused; the
declared sizes are summed before anything is written, and the bytes actually inflated are counted against each
entry's declared size and the bound while they are written (a zip bomb may lie about its sizes).
"""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path, PurePosixPath

MAX_BYTES = 4 << 30  # an Argos package is a few hundred MB at most
MAX_ENTRIES = 10_000
CHUNK = 1 << 20


class UnsafeZip(ValueError):
    """A zip that would write outside its directory, or more than the bound; the message names the entry."""


def _member_path(info: zipfile.ZipInfo) -> PurePosixPath:
    """The entry's relative path, or :class:`UnsafeZip` when it is absolute, climbs out or is a special file."""
    name = info.filename
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no Unix file type recorded (a plain file)
    if kind == stat.S_IFLNK:
        raise UnsafeZip(f"zip entry {name!r} is a symbolic link")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise UnsafeZip(f"zip entry {name!r} is not a regular file or directory")
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or (path.parts and ":" in path.parts[0]) or not path.parts:
        raise UnsafeZip(f"zip entry {name!r} has an absolute path")
    if ".." in path.parts or "\0" in name:
        raise UnsafeZip(f"zip entry {name!r} climbs out of the package")
    return path


def _copy(archive: zipfile.ZipFile, info: zipfile.ZipInfo, dest: Path, budget: int) -> int:
    """Inflate one entry into ``dest``; returns its size. Stops at its declared size or the budget."""
    written = 0
    with archive.open(info) as src, dest.open("xb") as out:
        while chunk := src.read(CHUNK):
            written += len(chunk)
            if written > info.file_size or written > budget:
                raise UnsafeZip(f"zip entry {info.filename!r} inflates past its declared size or the bound")
            out.write(chunk)
    return written


def extract(zip_path: Path, dest: Path, max_bytes: int = MAX_BYTES) -> None:
    """Unpack ``zip_path`` into the empty directory ``dest``.

    Raises:
        UnsafeZip: an entry that climbs out, a link or special file, too many entries, or more than ``max_bytes``
            declared or inflated; also a file that is not a zip or a corrupted one.
    """
    try:
        with zipfile.ZipFile(zip_path) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_ENTRIES:
                raise UnsafeZip(f"{zip_path.name} has {len(infos)} entries, more than {MAX_ENTRIES}")
            paths = [_member_path(info) for info in infos]
            declared = sum(info.file_size for info in infos)
            if declared > max_bytes:
                raise UnsafeZip(f"{zip_path.name} declares {declared} bytes unpacked, more than {max_bytes}")
            budget = max_bytes
            for info, path in zip(infos, paths, strict=True):
                target = dest.joinpath(*path.parts)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                budget -= _copy(archive, info, target, budget)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as e:
        raise UnsafeZip(f"{zip_path.name} is not a readable zip: {e}") from None
    except FileExistsError:
        raise UnsafeZip(f"{zip_path.name} holds the same file twice") from None
    except OSError as e:
        raise UnsafeZip(f"{zip_path.name} cannot be unpacked: {e.strerror or e}") from None
