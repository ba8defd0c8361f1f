"""Plain-text files (``.txt``): UTF-8, translated line by line, empty lines and each line's surrounding whitespace
kept."""

from __future__ import annotations

from service.errors import UnreadableFile
from service.formats.base import Translate, rebuild, translate_units


def decode_utf8(data: bytes, what: str) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped).

    Raises:
        UnreadableFile: it is not UTF-8.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UnreadableFile(f"the {what} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from e


async def translate_file(data: bytes, translate: Translate, target: str) -> bytes:
    """A ``.txt`` file translated: every non-empty line, its whitespace and the empty lines kept.

    Raises:
        UnreadableFile: the file is not UTF-8.
    """
    text = decode_utf8(data, ".txt file")
    return rebuild(text, await translate_units([text], translate)).encode("utf-8")
