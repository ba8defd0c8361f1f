"""uvicorn's access log without API keys: a key sent in the query string (``api_key``, as deep-translator and
LibreTranslate's clients may send it) is logged as ``api_key=***``, so that keys appear in no log."""

from __future__ import annotations

import logging
from urllib.parse import unquote_plus

ACCESS_LOGGER = "uvicorn.access"  # uvicorn logs one line a response here, the path with its query string
HIDDEN = "api_key"


def redact(path: str) -> str:
    """``path`` (a path with its query string, as uvicorn logs it) with the value of every ``api_key`` field
    replaced by ``***``. A field's name is read as the query-string parser reads it (service/http/body.py:
    ``&``-separated, percent- and plus-decoded), so ``api%5Fkey=...`` is hidden too; the rest is left as sent."""
    base, mark, query = path.partition("?")
    if not mark:
        return path
    fields = [
        f"{HIDDEN}=***" if "=" in field and unquote_plus(field.partition("=")[0]) == HIDDEN else field
        for field in query.split("&")
    ]
    return f"{base}?{'&'.join(fields)}"


class HideKeys(logging.Filter):
    """Rewrites the access log's path argument (the only one that can hold a ``?``) before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, str) and "?" in a for a in record.args):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


HIDE_KEYS = HideKeys()  # one instance: adding it again is a no-op


def hide_keys() -> None:
    """Filter uvicorn's access logger (whatever its handlers: the root's, or uvicorn's own log config's); called
    where the lifespan configures logging, before the server answers its first request."""
    logging.getLogger(ACCESS_LOGGER).addFilter(HIDE_KEYS)
