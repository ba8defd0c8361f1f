"""API keys and their limits: ``ATTNSERVE_API_KEYS`` and ``ATTNSERVE_API_KEYS_FILE``, the file re-read when it
changes.

The file is either one key a line (``#`` comments), every key without limits, or a JSON object of keys and their
limits, every limit optional: ``{"<key>": {"requests_per_minute": 60, "chars_per_request": 5000,
"chars_per_minute": 50000}}``. Messages name the file and an entry's position, never a key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("attnserve")

CHECK_INTERVAL_S = 1.0  # how often the request path may stat the file


class KeyLimits(BaseModel):
    """One key's limits; None = no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int | None = Field(None, ge=1, description="Requests a minute; a list of n texts counts n.")
    chars_per_request: int | None = Field(None, ge=1, description="Characters of all texts of one request.")
    chars_per_minute: int | None = Field(None, ge=1, description="Characters a minute.")


UNLIMITED = KeyLimits()


class KeysFileError(ValueError):
    """The keys file cannot be read or parsed; the message names the file and the entry."""


def parse_keys(text: str) -> dict[str, KeyLimits]:
    """The keys of a keys file's text, in either format.

    Raises:
        KeysFileError: invalid JSON, an entry that is not an object of known limits, or an empty key.
    """
    if not text.lstrip().startswith("{"):
        lines = (ln.strip() for ln in text.splitlines())
        return {ln: UNLIMITED for ln in lines if ln and not ln.startswith("#")}
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as e:
        raise KeysFileError(f"not valid JSON: {e}") from None  # JSONDecodeError's message quotes no content
    keys: dict[str, KeyLimits] = {}
    for n, (key, value) in enumerate(entries.items(), 1):
        if not key.strip():
            raise KeysFileError(f"entry {n}: the key is empty")
        try:
            keys[key] = KeyLimits.model_validate(value)
        except ValidationError as e:
            what = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'value'}: {err['msg']}" for err in e.errors())
            raise KeysFileError(f"entry {n}: {what}") from None
    return keys


def read_keys_file(path: Path) -> dict[str, KeyLimits]:
    """The keys of the file at ``path``.

    Raises:
        KeysFileError: the file cannot be read or parsed (the message starts with the path).
    """
    try:
        return parse_keys(path.read_text())
    except OSError as e:
        raise KeysFileError(f"{path}: cannot read it: {e.strerror}") from None
    except KeysFileError as e:
        raise KeysFileError(f"{path}: {e}") from None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class Keys:
    """The keys a server accepts, with their limits.

    A key is found by its SHA-256 digest, then compared in constant time; the file's keys are re-read when its
    modification time, size or inode changes, checked at most once a second when a key is looked up. A file that
    becomes unreadable or invalid keeps the previous keys and logs a warning.
    """

    def __init__(self, fixed: Iterable[str], path: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fixed = dict.fromkeys(fixed, UNLIMITED)
        self.path, self.clock = path, clock
        self._next_check = 0.0
        self._by_digest: dict[bytes, tuple[bytes, KeyLimits]] = {}
        self._stamp = None if path is None else _stamp(path)
        self._load(None if path is None else read_keys_file(path))
        self.configured = bool(self.fixed) or path is not None

    def _load(self, from_file: dict[str, KeyLimits] | None) -> None:
        keys = {**self.fixed, **(from_file or {})}  # a key in both keeps the file's limits
        self._by_digest = {_digest(k): (k.encode(), limits) for k, limits in keys.items()}
        self._next_check = self.clock() + CHECK_INTERVAL_S

    def refresh(self) -> None:
        """Re-read the file if it changed (at most one ``stat`` a second)."""
        if self.path is None or self.clock() < self._next_check:
            return
        self._next_check = self.clock() + CHECK_INTERVAL_S
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp  # taken before the read: a write in between is seen at the next check
        try:
            self._load(read_keys_file(self.path))
        except KeysFileError as e:
            log.warning("ATTNSERVE_API_KEYS_FILE: %s; keeping the previous keys", e)
            return
        log.info("ATTNSERVE_API_KEYS_FILE: re-read %s (%d keys)", self.path, len(self._by_digest))

    def lookup(self, given: str) -> KeyLimits | None:
        """The limits of key ``given``, or None when it is not a key."""
        self.refresh()
        found = self._by_digest.get(_digest(given))
        if found is None or not hmac.compare_digest(given.encode(), found[0]):
            return None
        return found[1]


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino
