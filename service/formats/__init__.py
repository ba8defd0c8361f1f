"""Files that ``POST /translate_file`` translates, one format per file extension: a format plugs in with one
:func:`register` line."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import PurePath

from service.formats import html, po, text
from service.formats.base import Translate


@dataclass(frozen=True)
class FileFormat:
    """One accepted kind of file.

    Attributes:
        extension: the file name's ending, lower case with its dot (``.po``).
        media_type: what ``GET /download_file`` answers it as.
        translate: (the file's bytes, a text translator, the target language) → the translated file's bytes; it
            raises ``UnreadableFile`` for a file that is not what its extension says.
    """

    extension: str
    media_type: str
    translate: Callable[[bytes, Translate, str], Awaitable[bytes]]


FORMATS: dict[str, FileFormat] = {}


def register(file_format: FileFormat) -> None:
    """Accept files with ``file_format.extension``."""
    FORMATS[file_format.extension] = file_format


def format_for(filename: str) -> FileFormat | None:
    """The format of a file name by its extension (any case), or None when it is not accepted."""
    return FORMATS.get(PurePath(filename).suffix.lower())


def accepted() -> list[str]:
    """The accepted extensions, as ``/frontend/settings``' ``supportedFilesFormat`` lists them."""
    return sorted(FORMATS)


register(FileFormat(".txt", "text/plain; charset=utf-8", text.translate_file))
register(FileFormat(".po", "text/x-gettext-translation; charset=utf-8", po.translate_file))
register(FileFormat(".pot", "text/x-gettext-translation; charset=utf-8", po.translate_file))
register(FileFormat(".html", "text/html; charset=utf-8", html.translate_file))
