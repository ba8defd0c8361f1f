"""Building a language pair's corpus: the .debs' catalogs read, cleaned, deduplicated, split and written."""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.corpus.cleaning import DROP_RULES, clean_pair, keep_pair
from model.corpus.extraction import read_deb, summarize_license
from model.corpus.fetching import find_debs
from model.corpus.split import DEV_BUCKETS, SPLITS, TEST_BUCKETS, split_hash, split_of
from model.data import write_tsv

LOG = logging.getLogger(__name__)


def parse_pair(pair: str) -> tuple[str, str]:
    """Split ``"en-ja"`` into ``("en", "ja")``.

    Raises:
        ValueError: If the pair is malformed or its source is not English (the catalogs' msgids are English).
    """
    match = re.fullmatch(r"([a-z]{2,3})-([a-z]{2,3})", pair)
    if not match:
        raise ValueError(f"pair {pair!r} must look like 'en-ja'")
    if match.group(1) != "en":
        raise ValueError(f"pair {pair!r}: gettext catalogs only give English sources; use 'en-<lang>'")
    return match.group(1), match.group(2)


@dataclass
class Harvest:
    """What the .debs' catalogs give, cleaned: the kept and the dropped distinct pairs, with their packages."""

    kept: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    dropped: dict[tuple[str, str], tuple[str, set[str]]] = field(default_factory=dict)
    dropped_counts: Counter[str] = field(default_factory=Counter)  # per catalog entry (occurrence), before dedup
    raw_pairs: int = 0
    catalogs: int = 0
    licenses: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    packages_with_catalogs: set[str] = field(default_factory=set)


def harvest(debs: list[Path], target_lang: str, on_deb: Callable[[str], None] | None = None) -> Harvest:
    """Read every catalog of ``debs`` for ``target_lang``, clean each pair and keep or drop it (:func:`keep_pair`)."""
    h = Harvest()
    for deb in debs:
        result = read_deb(deb, target_lang)
        h.licenses[result.package] = summarize_license(result.copyright, result.copyright_link)
        for path in sorted(result.catalogs):
            h.catalogs += 1
            h.packages_with_catalogs.add(result.package)
            for raw_source, raw_target in result.catalogs[path]:
                h.raw_pairs += 1
                source, target = clean_pair(raw_source, raw_target, target_lang)
                reason = keep_pair(source, target, target_lang)
                if reason is None:
                    h.kept[source, target].add(result.package)
                else:
                    h.dropped_counts[reason] += 1
                    h.dropped.setdefault((source, target), (reason, set()))[1].add(result.package)
        if on_deb is not None:
            on_deb(deb.name)
    return h


Rows = dict[str, list[tuple[int, str, str, str]]]  # split -> (split hash, source, target, packages), sorted


def write_splits(h: Harvest, out_dir: Path) -> tuple[Rows, Counter[str]]:
    """Write the kept pairs' train/dev/test TSVs and dropped.tsv; return the rows by split and the pairs a package
    gave."""
    rows: Rows = {split: [] for split in SPLITS}
    package_pairs: Counter[str] = Counter()
    for (source, target), packages in h.kept.items():
        rows[split_of(source)].append((split_hash(source), source, target, ",".join(sorted(packages))))
        package_pairs.update(packages)
    for split in SPLITS:
        rows[split].sort()
        write_tsv(out_dir / f"{split}.tsv", (row[1:] for row in rows[split]))
    write_tsv(
        out_dir / "dropped.tsv",
        sorted((reason, s, t, ",".join(sorted(p))) for (s, t), (reason, p) in h.dropped.items()),
    )
    return rows, package_pairs


def summarize(
    pair: str, h: Harvest, rows: Rows, package_pairs: Counter[str], debs: list[Path], command: str
) -> dict[str, Any]:
    """summary.json's content: counts by split and drop rule, the split's definition, the packages and licenses."""
    dropped_unique = Counter(reason for reason, _ in h.dropped.values())
    return {
        "pair": pair,
        "command": command,
        "counts": {split: len(rows[split]) for split in SPLITS},
        "sources": {split: len({row[1] for row in rows[split]}) for split in SPLITS},
        "total_pairs": len(h.kept),
        "raw_pairs": h.raw_pairs,
        "catalogs": h.catalogs,
        "dropped": {rule: h.dropped_counts[rule] for rule in DROP_RULES},
        "dropped_unique": {rule: dropped_unique[rule] for rule in DROP_RULES},
        "duplicates_merged": h.raw_pairs - sum(h.dropped_counts.values()) - len(h.kept),
        "split": {
            "hash": "sha256(split_key(source))[:8] mod 1000",
            "test_buckets": [TEST_BUCKETS.start, TEST_BUCKETS.stop],
            "dev_buckets": [DEV_BUCKETS.start, DEV_BUCKETS.stop],
        },
        "packages_read": len(debs),
        "packages_with_catalogs": len(h.packages_with_catalogs),
        "packages_contributing": len(package_pairs),
        "packages": {
            package: {
                "pairs": package_pairs[package],
                "license": h.licenses[package][0],
                "licenses": h.licenses[package][1],
            }
            for package in sorted(h.licenses)
            if package in package_pairs
        },
        "debs": [deb.name for deb in debs],
    }


def build(
    pair: str,
    debs_dir: Path,
    out_dir: Path,
    *,
    command: str | None = None,
    on_deb: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build the corpus for one language pair from the .debs in ``debs_dir``.

    Writes ``train.tsv``, ``dev.tsv``, ``test.tsv`` (``source<TAB>target<TAB>packages``, sorted by split hash then
    text), ``dropped.tsv`` (``rule<TAB>source<TAB>target<TAB>packages``: every distinct dropped pair, for audits) and
    ``summary.json``. The same .debs give byte-identical files.

    Args:
        pair: ``"en-ja"``, ``"en-de"``, ...
        debs_dir: Directory of downloaded .deb files.
        out_dir: Output directory; created if missing, files in it are overwritten.
        command: The command line to record in the summary.
        on_deb: Called with each .deb's file name after it is read (for a progress bar).

    Returns:
        The summary (also written to ``summary.json``).

    Raises:
        FileNotFoundError: If ``debs_dir`` has no .deb files.
    """
    _, target_lang = parse_pair(pair)
    debs = find_debs(debs_dir)
    if not debs:
        raise FileNotFoundError(f"no .deb files in {debs_dir}; run with --download")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    h = harvest(debs, target_lang, on_deb)
    rows, package_pairs = write_splits(h, out_dir)
    command = command or f"model.corpus.build({pair!r}, {str(debs_dir)!r}, {str(out_dir)!r})"
    summary = summarize(pair, h, rows, package_pairs, debs, command)
    (out_dir / "summary.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    LOG.info(
        "%s: %d pairs (train %d, dev %d, test %d) from %d packages in %.0f s",
        pair,
        len(h.kept),
        *(len(rows[split]) for split in SPLITS),
        len(package_pairs),
        time.monotonic() - started,
    )
    return summary
