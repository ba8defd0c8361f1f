"""The train/dev/test split, by a stable hash of the normalized English source."""

from __future__ import annotations

import hashlib
import re

from model.corpus.cleaning import WHITESPACE_RE

SPLIT_BUCKETS = 1000
TEST_BUCKETS = range(0, 12)  # 12 of the 1,000 buckets each for test and dev: thousands of pairs for en-ja and en-de
DEV_BUCKETS = range(12, 24)
SPLITS = ("train", "dev", "test")
_SPLIT_TRAILING_RE = re.compile(r"[\s.:…!?;,]+$")


def split_key(source: str) -> str:
    """The normalized English text that decides a pair's split.

    Case-folded, whitespace collapsed, and trailing punctuation ("...", "…", ":") removed, so that "Open File",
    "open file" and "Open File..." land in the same split and the test set does not reward memorizing near-duplicates.
    """
    return _SPLIT_TRAILING_RE.sub("", WHITESPACE_RE.sub(" ", source.casefold()).strip())


def split_hash(source: str) -> int:
    """A stable 64-bit hash of :func:`split_key` (the first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(split_key(source).encode("utf-8")).digest()[:8], "big")


def split_of(source: str) -> str:
    """The split of an English source: ``"test"``, ``"dev"`` or ``"train"``.

    ``split_hash(source) mod 1000`` picks a bucket; :data:`TEST_BUCKETS` and :data:`DEV_BUCKETS` (12 each) go to test
    and dev. It depends on the English text only, so every translation of one source lands in the same split.
    """
    bucket = split_hash(source) % SPLIT_BUCKETS
    if bucket in TEST_BUCKETS:
        return "test"
    if bucket in DEV_BUCKETS:
        return "dev"
    return "train"


# --------------------------------------------------------------------------------------------------------------------
