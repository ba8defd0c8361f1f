"""What a set of bundles serves, read from their manifests alone: the language pairs of each bundle, the pairs served
through a pivot language, and what a bundle weighs on disk. Nothing here loads a graph."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from service.runtime.manifest import Manifest

Pair = tuple[str, str]  # (source language, target language)


def pair_label(pair: Pair) -> str:
    """A pair as the metrics' ``pair`` label writes it: ``en-de``."""
    return f"{pair[0]}-{pair[1]}"


def pairs_of(manifest: Manifest) -> list[Pair]:
    """The language pairs one bundle serves: its ``source_lang`` into each of its targets (the manifest's
    ``targets``, a multi-target model's; else ``target_lang``), as service.runtime.bundle's ``Bundle.targets`` reads
    them. The registry (service/serving/pairs.py) keys by pair with a bundle behind each."""
    source = manifest.source_lang
    if not manifest.targets:
        return [(source, manifest.target_lang)]
    return [(source, str(e["code"])) for e in manifest.targets]


@dataclass(frozen=True)
class Pivot:
    """``source`` → ``target`` served in two hops through ``via``: no bundle serves it directly."""

    source: str
    via: str
    target: str

    @property
    def pair(self) -> Pair:
        return self.source, self.target

    @property
    def hops(self) -> tuple[Pair, Pair]:
        """The two direct pairs, in order."""
        return (self.source, self.via), (self.via, self.target)


def pivots(direct: Iterable[Pair], via: str) -> list[Pivot]:
    """Every pair X→Y that no bundle serves but X→``via`` and ``via``→Y do (X ≠ Y), sorted; none when ``via`` is
    empty."""
    served = set(direct)
    if not via:
        return []
    into = sorted(s for s, t in served if t == via and s != via)
    out_of = sorted(t for s, t in served if s == via and t != via)
    return [Pivot(x, via, y) for x in into for y in out_of if x != y and (x, y) not in served]


def bundle_files(path: Path, manifest: Manifest) -> list[Path]:
    """The bundle's files that exist: every file with a checksum, and the derived graphs already written."""
    names = set(manifest.sha256) | set(manifest.derived)
    return [path / n for n in sorted(names) if (path / n).is_file()]


def readable_pairs(path: Path) -> list[Pair]:
    """The pairs the manifest at ``path`` names; none when it cannot be read (loading the bundle then says why)."""
    try:
        return pairs_of(Manifest.read(path))
    except (OSError, ValueError, KeyError, TypeError):
        return []


def disk_bytes(path: Path, manifest: Manifest) -> int:
    """The size on disk of :func:`bundle_files` (the manifest not counted)."""
    return sum(f.stat().st_size for f in bundle_files(path, manifest))


def bundle_for(paths: Sequence[Path], source: str | None = None, target: str | None = None) -> Path:
    """The first of ``paths`` whose manifest serves ``source`` → ``target`` (None: any language), else the first
    path: loading it then says what is wrong. For the commands that run one engine in-process."""
    for path in paths:
        if any(source in (None, s) and target in (None, t) for s, t in readable_pairs(path)):
            return path
    return paths[0]
