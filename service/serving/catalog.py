"""What a set of bundles serves, read from their manifests alone: the language pairs of each bundle, the pairs served
through a pivot language, and what a bundle weighs on disk and loaded (its graphs' initializer headers). Nothing here
opens a session."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from service.runtime.bundle import Bundle
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


def served_graphs(manifest: Manifest, variant: str, exact: bool = True) -> list[str]:
    """The graph files whose sessions a CPU engine opens to serve ``variant`` (service/serving/engine.py's
    ``Runners``), each once: float32's exact encoder and fast decoder (the encoder's session shared), another
    variant's encoder and decoder; with ``exact``, the exact float32 graphs too (encoder, decoder and forced
    decoder), which /attention, ``return_details`` and span placement load on first need."""
    graphs = manifest.graphs
    if variant == "float32":
        served = [graphs[role] for role in ("encoder", "fast_decoder") if role in graphs]
    else:  # a variant the bundle lacks opens nothing: its load says so
        served = [f for role, f in graphs.get(variant, {}).items() if role in ("encoder", "decoder")]
    exact_graphs = [graphs[role] for role in ("encoder", "decoder", "forced_decoder") if role in graphs]
    return list(dict.fromkeys([*served, *(exact_graphs if exact else [])]))


def loaded_bytes(path: Path, manifest: Manifest, variant: str, exact: bool = True) -> int:
    """The weights of :func:`served_graphs` as ONNX Runtime holds them: each session's initializers, float16 ones
    that a ``Cast`` turns into float32 counted as float32 (:func:`weight_bytes`). What ``models_memory_mb`` counts.

    Raises:
        OSError: a graph cannot be read.
    """
    return sum(weight_bytes(path / name) for name in served_graphs(manifest, variant, exact))


def footprint(bundle: Bundle, override: str | None) -> int:
    """What a loaded bundle counts against ``models_memory_mb``: :func:`loaded_bytes` of the variant it serves
    (``override``: ``ATTNSERVE_GRAPH_VARIANT``), its exact graphs included (the bound holds once they are open).

    Raises:
        OSError: a graph cannot be read.
    """
    return loaded_bytes(bundle.path, bundle.manifest, bundle.served_variant(override))


def weight_bytes(graph: Path) -> int:
    """The bytes of a graph's initializers once loaded (:func:`initializer_bytes`), summed.

    Raises:
        OSError: the graph cannot be read.
        ValueError: it is not an ONNX graph.
    """
    return sum(initializer_bytes(graph).values())


def initializer_bytes(graph: Path) -> Mapping[str, int]:
    """Each of a graph's initializers once loaded, by the name its nodes read it under: float16 ones that feed a
    ``Cast`` to float32 (a bundle's float16-stored weights) as float32, under the Cast's name, int8 ones as int8
    (their scales apart). Read from the graph's headers (external data not read), once per file version.

    Raises:
        OSError: the graph cannot be read.
        ValueError: it is not an ONNX graph.
    """
    st = graph.stat()
    return _initializer_bytes(str(graph), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _initializer_bytes(graph: str, mtime_ns: int, size: int) -> Mapping[str, int]:
    import onnx

    try:
        g = onnx.load(graph, load_external_data=False).graph
    except OSError:
        raise
    except Exception as e:  # protobuf's DecodeError, among others, for a file that is not a graph
        raise ValueError(f"{graph}: not an ONNX graph ({type(e).__name__}: {e})") from None
    to_float = {n.input[0]: n.output[0] for n in g.node
                if n.op_type == "Cast" and onnx.helper.get_node_attr_value(n, "to") == 1}  # fmt: skip
    return MappingProxyType({
        to_float.get(t.name, t.name): math.prod(t.dims) * (
            4 if t.name in to_float else onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize)
        for t in g.initializer
    })  # fmt: skip


def bundle_for(paths: Sequence[Path], source: str | None = None, target: str | None = None) -> Path:
    """The first of ``paths`` whose manifest serves ``source`` → ``target`` (None: any language), else the first
    path: loading it then says what is wrong. For the commands that run one engine in-process."""
    for path in paths:
        if any(source in (None, s) and target in (None, t) for s, t in readable_pairs(path)):
            return path
    return paths[0]
