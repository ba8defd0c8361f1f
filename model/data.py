"""The corpus' TSV files: one row a line, ``source<TAB>target<TAB>packages`` (packages: comma-joined names of the
Debian packages the pair came from; dropped.tsv puts the drop rule first)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path


def write_tsv(path: Path, rows: Iterable[tuple[str, ...]]) -> None:
    """Write ``rows``, each a tuple of tab-free fields, one a line with Unix line ends."""
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write("\t".join(row) + "\n")


def read_tsv(path: Path) -> Iterator[tuple[str, str, str]]:
    """Rows ``(source, target, packages)`` of a corpus TSV file (train.tsv, dev.tsv, test.tsv)."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            source, target, packages = line.rstrip("\n").split("\t")
            yield source, target, packages


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """The corpus rows of ``path`` as (source, target) pairs: the first two fields of each line."""
    pairs = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            pairs.append((cols[0], cols[1]))
    return pairs
