"""``attnserve models``: what a server with the current settings would serve: each bundle with its pairs, where it
came from, its parameters, size on disk and loaded (the weights its sessions hold), stored precision, graph variants
and the one it serves, the Argos packages with their pairs and import state, and the pairs served through the pivot
language. It reads manifests, ONNX graphs' initializer headers and the packages' files (their content keys) only: no
session, no weights, no torch, no import."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from service.runtime.manifest import Manifest
from service.serving import packages
from service.serving.catalog import Pair, disk_bytes, loaded_bytes, pairs_of, pivots, readable_pairs, served_graphs
from service.settings import Settings

ONNX_FLOATS = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}  # TensorProto.DataType


@dataclass(frozen=True)
class Model:
    """One bundle as ``attnserve models`` lists it."""

    path: str
    name: str
    pairs: list[Pair]
    origin: str  # one line from the manifest's provenance
    provenance: dict[str, Any]
    parameters: int
    disk_bytes: int
    # What models_memory_mb counts: the weights of the graphs it serves and of its exact ones, as loaded; None while
    # a graph of the variant it serves is not derived yet.
    loaded_bytes: int | None
    precision: list[str]  # the floating-point types of the float32 graphs' stored weights
    variants: dict[str, str]  # variant -> "shipped", "derived" or "not derived yet"
    serves: str  # the variant /translate serves: ATTNSERVE_GRAPH_VARIANT, else the bundle's default_variant
    shadowed_by: str | None = None  # a shipped bundle not served: the user's bundle or package that serves its pair


def add_parser(sub: Any) -> None:
    """``attnserve models [--json]``."""
    p = sub.add_parser("models", help="list the bundles and pairs a server with these settings would serve")
    p.add_argument("--bundle", type=Path, action="append", help="bundle directory (default: ATTNSERVE_BUNDLES)")
    p.add_argument("--json", action="store_true", help="one JSON object: bundles and pivot pairs")


@dataclass(frozen=True)
class PackageRow:
    """One Argos package folder as ``attnserve models`` lists it."""

    folder: str
    pairs: list[Pair]
    state: str  # service/serving/packages.py's states; "cached": its bundle is listed among the bundles
    bundle: str | None
    reason: str


def main(args: Any, settings: Settings) -> int:
    """Print the table (or ``--json``); 2 with one line on stderr for a bundle whose manifest cannot be read."""
    try:
        found = listed_packages(settings)
    except OSError as e:
        print(f"attnserve: {settings.packages_dir()}: cannot read the packages directory ({e})", file=sys.stderr)
        return 2
    models = []
    for path in [*settings.served_bundles(), *(Path(p.bundle) for p in found if p.bundle)]:
        try:
            models.append(describe(path, settings.graph_variant))
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"attnserve: {path}: cannot be read as a bundle ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    models = shadowing(models, settings)
    direct = [p for m in models if m.shadowed_by is None for p in m.pairs]
    pivoted = [(p.source, p.via, p.target) for p in pivots(direct, settings.pivot_language)]
    if args.json:
        listing = {"bundles": [asdict(m) for m in models], "packages": [asdict(p) for p in found], "pivots": pivoted}
        print(json.dumps(listing, ensure_ascii=False, indent=2))
    else:
        print(table(models, pivoted, found))
    return 0


def shadowing(models: list[Model], settings: Settings) -> list[Model]:
    """``models`` with each shipped bundle whose pair the user's bundles or packages serve marked as shadowed by
    the one that serves it (service/serving/startup.py's precedence)."""
    users = {p: m.path for m in models if not settings.is_shipped(Path(m.path)) for p in m.pairs}
    out = []
    for m in models:
        taken = [p for p in m.pairs if p in users] if settings.is_shipped(Path(m.path)) else []
        out.append(replace(m, shadowed_by=users[taken[0]]) if taken else m)
    return out


def listed_packages(settings: Settings) -> list[PackageRow]:
    """The packages directory's packages as a server would find them (none imported here): a package whose pair
    a user's bundle of ``BUNDLES`` (not a shipped one) or an earlier package already serves is ``shadowed``, its
    bundle not served.

    Raises:
        OSError: the directory cannot be listed.
    """
    directory = settings.packages_dir()
    if directory is None:
        return []
    taken: set[Pair] = set()
    for path in [p for p in settings.served_bundles() if not settings.is_shipped(p)]:
        taken.update(readable_pairs(path))
    rows = []
    for o in packages.sync(directory, settings.argos_cache, importer=None):
        state, bundle, reason = o.state, str(o.bundle) if o.bundle else None, o.reason
        if o.pair in taken and o.bundle is not None:
            state, bundle, reason = "shadowed", None, f"{'→'.join(o.pair)} is served by another bundle"
        taken.update([o.pair] if o.pair and bundle else [])
        rows.append(PackageRow(str(o.folder), [o.pair] if o.pair else [], state, bundle, reason))
    return rows


def describe(path: Path, override: str | None = None) -> Model:
    """One bundle, from its manifest and its float32 graphs' initializer headers; ``override``: the variant that
    ``ATTNSERVE_GRAPH_VARIANT`` names for every bundle (None: each serves its manifest's ``default_variant``).

    Raises:
        OSError, ValueError, KeyError, TypeError: no readable manifest, or one without the fields it needs.
    """
    manifest = Manifest.read(path)
    graphs = manifest.graphs
    variants = {"float32": "shipped"}
    derived = manifest.derived
    for name, files in graphs.items():
        if isinstance(files, dict):
            variants[name] = variant_state(path, list(files.values()), derived)
    provenance = manifest.provenance
    serves = override or manifest.default_variant
    derived_yet = all((path / f).is_file() for f in served_graphs(manifest, serves))
    return Model(
        path=str(path),
        name=manifest.name,
        pairs=pairs_of(manifest),
        origin=origin(provenance),
        provenance=provenance,
        parameters=parameters(manifest.model),
        disk_bytes=disk_bytes(path, manifest),
        loaded_bytes=loaded_bytes(path, manifest, serves) if derived_yet else None,
        precision=precision([path / graphs["encoder"], path / graphs["decoder"]]),
        variants=variants,
        serves=serves,
    )


def variant_state(path: Path, files: list[str], derived: dict[str, Any]) -> str:
    """``shipped`` (exported with the bundle), ``derived`` (written from the shipped graphs, on a first start or by
    ``attnserve derive``) or ``not derived yet``."""
    if not set(files) & set(derived):
        return "shipped"
    return "derived" if all((path / f).is_file() for f in files) else "not derived yet"


def origin(provenance: dict[str, Any]) -> str:
    """Where a bundle came from, in a few words."""
    if "imported_from" in provenance:
        ct2 = provenance.get("ctranslate2")
        via = f" (Argos package, CTranslate2 {ct2.get('spec')})" if isinstance(ct2, dict) else ""
        return f"imported from {provenance['imported_from']}{via}"
    if "exported" in provenance:
        return f"trained here, exported {provenance['exported']}"
    return "unknown (no provenance in the manifest)"


def parameters(model: dict[str, Any]) -> int:
    """The Transformer's trained parameters (model/transformer.py: tied matrices once, no buffers)."""
    d, d_ff, v = int(model["d_model"]), int(model["d_ff"]), int(model["vocab_size"])
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder = int(model["n_encoder_layers"]) * (attention + ffn + 2 * norm)
    decoder = int(model["n_decoder_layers"]) * (2 * attention + ffn + 3 * norm)
    embeddings = v * d * (1 if model.get("tie_embeddings", True) else 3)
    final = 2 * norm if model.get("normalize_before", False) else 0
    return encoder + decoder + embeddings + final


def precision(graphs: list[Path]) -> list[str]:
    """The floating-point types the graphs' initializers are stored in (headers only: external data not read)."""
    import onnx

    found = set()
    for graph in graphs:
        for tensor in onnx.load(str(graph), load_external_data=False).graph.initializer:
            if tensor.data_type in ONNX_FLOATS:
                found.add(ONNX_FLOATS[tensor.data_type])
    return sorted(found)


def table(models: list[Model], pivoted: list[tuple[str, str, str]], found: list[PackageRow]) -> str:
    """The plain table: one line a bundle, then the Argos packages, then the pivot pairs."""
    rows = [("bundle", "pairs", "parameters", "disk", "loaded", "precision", "variants", "serves", "origin")]
    for m in [m for m in models if m.shadowed_by is None]:
        variants = ", ".join(v if s == "shipped" else f"{v} ({s})" for v, s in m.variants.items())
        pairs = " ".join(f"{s}→{t}" for s, t in m.pairs)
        size, loaded = (f"{n / (1 << 20):.1f} MiB" if n is not None else "?" for n in (m.disk_bytes, m.loaded_bytes))
        rows.append(
            (m.name, pairs, f"{m.parameters:,}", size, loaded, "/".join(m.precision), variants, m.serves, m.origin)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows]
    shadowed = [m for m in models if m.shadowed_by is not None]
    if shadowed:
        lines += ["", "shadowed (shipped, not served: the user's models serve their pairs):"]
        lines += [f"  {m.name}  {' '.join('→'.join(p) for p in m.pairs)}  by {m.shadowed_by}" for m in shadowed]
    if found:
        lines += ["", "Argos packages:"]
        for p in found:
            where = p.bundle if p.bundle else p.reason
            pairs = " ".join(f"{s}→{t}" for s, t in p.pairs) or "?"
            lines.append(f"  {Path(p.folder).name}  {pairs}  {p.state}: {where}")
    if pivoted:
        lines += ["", "through a pivot language:"]
        lines += [f"  {s}→{t} via {v} ({s}→{v}, {v}→{t})" for s, v, t in pivoted]
    return "\n".join(lines)
