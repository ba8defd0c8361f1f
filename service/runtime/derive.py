"""Graphs a bundle derives instead of shipping: the int8 variant, quantized without torch (ONNX Runtime's dynamic
quantization) from the fast graphs that the bundle ships, written beside them on first load and checked against
the manifest's sha256.

The manifest's ``derived`` object maps each derived file to ``{"from": SOURCE, "by": HOW, "onnxruntime": VERSION}``:
``HOW`` is one of :data:`DERIVE`, ``VERSION`` the ONNX Runtime that derived the manifest's sha256 (another version's
optimizer and quantizer may write other bytes, which the sha256 check then refuses). A derived file is the cache:
present, it is verified like every other file; missing, it is derived again if the bundle directory is writable (a
read-only one, such as a Docker image's, derives at build time: ``attnserve derive DIR``).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.runtime.kernels import KERNELS, attention_kernels, kernel_session
from service.runtime.manifest import MANIFEST, Manifest

log = logging.getLogger(__name__)


class DeriveError(ValueError):
    """A derived graph cannot be written; the message names the file."""


def inline(source: Path, tmp: Path) -> Path:
    """``source`` with its external data read in, as one file in ``tmp``: ONNX Runtime's optimized graphs and the
    quantizer's copies keep external references relative to where they are written."""
    import onnx

    whole = tmp / f"inline.{source.name}"
    onnx.save(onnx.load(str(source)), str(whole))
    return whole


def int8_encoder(source: Path, dest: Path, h: int) -> None:
    """The int8 encoder: the fast encoder (attnserve's kernels) optimized offline so that every MatMul's weight is a
    constant, then int8 weights for every MatMul (``quantize_dynamic``, QInt8)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        kernel_session(inline(source, Path(tmp)), optimized=prepared)
        quantize_dynamic(prepared, dest, weight_type=QuantType.QInt8)
    attention_kernels(dest, h, "attnserve")  # imports only the domains it uses


def int8_decoder(source: Path, dest: Path, h: int) -> None:
    """The int8 decoder of bundles exported before :func:`int8_per_channel`: the fast decoder with ONNX Runtime's
    attention kernels (what ``quant_pre_process`` can load) prepared, quantized as :func:`int8_encoder` does, and
    switched back to attnserve's kernels."""
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(inline(source, Path(tmp)), prepared, skip_symbolic_shape=True)
        quantize_dynamic(prepared, dest, weight_type=QuantType.QInt8)
    attention_kernels(dest, h, "attnserve")


# What the int8 step leaves out of a shipped graph: the fast decoder's greedy-token rows (its logits then come for
# every row) and the exact encoder's attention weights.
UNUSED_INPUTS = {"logit_rows", "token_rows"}
UNUSED_OUTPUTS = {"tokens", "encoder_attentions"}
# The quantizer's integer ops but Attention, which it would take attnserve's attention nodes for (it matches op types
# in any domain).
QUANTIZED = ["MatMul", "Gather", "Transpose"]


def without(model: Any, inputs: set[str], outputs: set[str]) -> None:
    """``model`` (an ONNX ModelProto) changed in place: without the graph inputs and outputs named, a ``Gather`` of
    rows by a dropped input bypassed (its readers read all rows), and without the nodes and initializers that only
    the dropped outputs needed."""
    graph = model.graph
    bypass = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[1] in inputs}
    for node in graph.node:
        node.input[:] = [bypass.get(name, name) for name in node.input]
    for out in graph.output:
        if out.name in bypass:
            raise ValueError(f"{out.name}: a graph output is a Gather of rows by {sorted(inputs)}")
    kept_outputs = [o for o in graph.output if o.name not in outputs]
    live = {o.name for o in kept_outputs}
    kept = []
    for node in reversed(graph.node):  # nodes are in topological order
        if any(name in live for name in node.output):
            kept.append(node)
            live.update(node.input)
    del graph.node[:], graph.output[:]
    graph.node.extend(reversed(kept))
    graph.output.extend(kept_outputs)
    kept_inputs = [i for i in graph.input if i.name in live and i.name not in inputs]
    kept_weights = [w for w in graph.initializer if w.name in live]
    del graph.input[:], graph.initializer[:]
    graph.input.extend(kept_inputs)
    graph.initializer.extend(kept_weights)


def standard_logits(model: Any) -> None:
    """``model`` changed in place: each ``attnserve.Logits`` node (the logits from the projection's panels) replaced
    by the MatMul that the quantizer quantizes, h times the projection transposed (d, V) as a constant, plus the
    bias. The panels and the bias may be float16 behind a Cast (model/export/store.py)."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {w.name: w for w in graph.initializer}
    casts = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Cast" and n.input[0] in weights}
    nodes = []
    for node in graph.node:
        if node.domain != KERNELS or node.op_type != "Logits":
            nodes.append(node)
            continue
        h, panels, bias = node.input
        P = numpy_helper.to_array(weights[casts.get(panels, panels)]).astype(np.float32)  # (V / 16, d, 16)
        V = int(weights[casts.get(bias, bias)].dims[0])
        name = f"{panels}.transposed"
        graph.initializer.append(numpy_helper.from_array(P.transpose(1, 0, 2).reshape(P.shape[1], -1)[:, :V], name))
        product = f"{node.output[0]}.product"
        nodes.append(helper.make_node("MatMul", [h, name], [product], name=f"{node.name}.matmul"))
        nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{node.name}.bias"))
    del graph.node[:]
    graph.node.extend(nodes)


def int8_per_channel(source: Path, dest: Path, h: int) -> None:
    """int8 graphs from the graphs every float32 bundle ships, with attnserve's kernels throughout (no ONNX Runtime
    attention op, whose kernels refuse some head sizes): the fast (or exact) encoder without attention weights, the
    fast decoder with logits for every row (ONNX's MatMul, not the panels' kernel) and no greedy tokens; optimized
    offline so that every MatMul's weight is a constant, then int8 weights with a scale per output column
    (``quantize_dynamic``, QInt8, per channel: a CTranslate2 int8 model's own scales, one per output row, come back
    from its dequantized weights)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        model = onnx.load(str(inline(source, Path(tmp))))
        standard_logits(model)
        without(model, UNUSED_INPUTS, UNUSED_OUTPUTS)
        trimmed, prepared = Path(tmp) / "trimmed.onnx", Path(tmp) / "prepared.onnx"
        onnx.save(model, str(trimmed))
        kernel_session(trimmed, optimized=prepared)
        quantize_dynamic(prepared, dest, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=QUANTIZED)
    attention_kernels(dest, h, "attnserve")


DERIVE: dict[str, Callable[[Path, Path, int], None]] = {
    "int8-encoder": int8_encoder,
    "int8-decoder": int8_decoder,
    "int8-per-channel": int8_per_channel,
}
INT8_FILES = {"encoder": "encoder.int8.onnx", "decoder": "decoder.int8.onnx"}
FUSED_ENCODER = "encoder.fast.onnx"  # the fused encoder an exporter may ship for the int8 step (no attention output)


def int8_variant(bundle_dir: Path, manifest: Manifest) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """How a float32 bundle gets its int8 graphs, from the graphs it ships: the fast encoder where it has one,
    else the exact encoder; the fast decoder. Returns ``graphs["int8"]``, the ``derived`` entries and the int8
    graphs' ``graph_forms`` entries.

    Raises:
        DeriveError: the bundle has no fast decoder, or no form for it.
    """
    import onnxruntime

    files = {p.name for p in bundle_dir.iterdir() if p.is_file()}
    graphs = manifest.graphs
    fast = graphs.get("fast_decoder")
    forms = manifest.graph_forms if isinstance(manifest.graph_forms, dict) else {}
    if not isinstance(fast, str) or fast not in files or not isinstance(forms.get(fast), dict):
        raise DeriveError(
            f"{bundle_dir}: no fast decoder to quantize (graphs.fast_decoder) — export the bundle again with this "
            "version (`attnserve export BUNDLE OUT --int8`)"
        )
    sources = {"encoder": FUSED_ENCODER if FUSED_ENCODER in files else str(graphs["encoder"]), "decoder": fast}
    derived = {
        INT8_FILES[role]: {"from": source, "by": "int8-per-channel", "onnxruntime": onnxruntime.__version__}
        for role, source in sources.items()
    }
    encoder_form = {"role": "encoder", "attentions": False}
    decoder_form = {**forms[fast], "greedy_tokens": False}
    return dict(INT8_FILES), derived, {INT8_FILES["encoder"]: encoder_form, INT8_FILES["decoder"]: decoder_form}


def add_int8(bundle_dir: Path) -> list[Path]:
    """Give a float32 bundle its int8 variant (:func:`int8_variant`): the graphs derived now and the manifest
    rewritten with them (their sha256 included). A bundle that has the variant is left as it is.

    Returns:
        The files derived (none when the bundle had the variant).

    Raises:
        DeriveError: the bundle cannot have the variant (why, in one line), or its directory is read-only.
        ManifestError: no readable manifest.
    """
    manifest = Manifest.read(bundle_dir)
    if "int8" in manifest.variants:
        return []
    if not os.access(bundle_dir, os.W_OK):
        raise DeriveError(f"{bundle_dir}: read-only — add the int8 graphs where it is writable")
    variant, derived, forms = int8_variant(bundle_dir, manifest)
    manifest.graphs["int8"] = variant
    manifest.add_derived(derived)
    manifest.add_graph_forms(forms)
    written = derive_missing(bundle_dir, manifest, force=True)
    manifest.write_with_checksums(bundle_dir)
    return written


class Theirs(logging.Filter):
    """Drops the records below ERROR that code under ``package`` logs through the root logger itself; as a filter of
    the root logger it never sees the records that other loggers hand up to the root's handlers."""

    def __init__(self, package: Path) -> None:
        super().__init__()
        self.package = str(package) + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not record.pathname.startswith(self.package)


@contextmanager
def quiet_quantizer() -> Iterator[None]:
    """Within it, ONNX Runtime's quantizer logs its errors only.

    The quantizer logs through the root logger (``logging.warning(...)``: advice such as "Please consider to run
    pre-processing before quantization", meant for calibrated quantization), which a logger's level cannot silence
    and whose first call gives a process without logging configured ``logging.basicConfig``'s handler for good; its
    helpers log through the ``onnxruntime`` loggers. Called around each derive, from the command line and from a
    server's first load alike.
    """
    import onnxruntime

    root, helpers = logging.getLogger(), logging.getLogger("onnxruntime")
    theirs, level = Theirs(Path(onnxruntime.__file__).parent), helpers.level
    # a handler keeps logging.warning from configuring the root; lastResort is what answers when there is none
    stand_in = None if root.handlers else (logging.lastResort or logging.NullHandler())
    root.addFilter(theirs)
    helpers.setLevel(logging.ERROR)
    if stand_in is not None:
        root.addHandler(stand_in)
    try:
        yield
    finally:
        if stand_in is not None:
            root.removeHandler(stand_in)
        helpers.setLevel(level)
        root.removeFilter(theirs)


def derived_entries(where: str, manifest: Manifest) -> dict[str, tuple[str, str]]:
    """The manifest's ``derived`` object as derived file -> (source file, how).

    Raises:
        DeriveError: the entry is malformed or names an unknown way.
    """
    entries = manifest.derived
    if not isinstance(entries, dict):
        raise DeriveError(f"{where}: derived: expected an object")
    out = {}
    for name, entry in sorted(entries.items()):
        if not isinstance(entry, dict) or set(entry) - {"onnxruntime"} != {"from", "by"} or entry["by"] not in DERIVE:
            raise DeriveError(
                f"{where}: derived[{name!r}]: expected {{'from': FILE, 'by': one of {sorted(DERIVE)}, 'onnxruntime': "
                "VERSION}"
            )
        out[name] = (str(entry["from"]), str(entry["by"]))
    return out


def derive_missing(bundle_dir: Path, manifest: Manifest, force: bool = False) -> list[Path]:
    """Derive every file of the manifest's ``derived`` that is missing (or every one, with ``force``) into
    ``bundle_dir``, each written to a temporary file and renamed, so that a reader never sees half a graph.

    Returns:
        The files derived.

    Raises:
        DeriveError: the directory is not writable, or a source is missing.
    """
    derived = []
    for name, (source, how) in derived_entries(str(bundle_dir / MANIFEST), manifest).items():
        dest = bundle_dir / name
        if dest.is_file() and not force:
            continue
        if not (bundle_dir / source).is_file():
            raise DeriveError(f"{bundle_dir / source}: missing (the source of the derived {name})")
        if not os.access(bundle_dir, os.W_OK):
            raise DeriveError(
                f"{dest}: missing, and {bundle_dir} is read-only — run `attnserve derive {bundle_dir}` where it is "
                "writable (the Docker image derives at build time)"
            )
        log.info("deriving %s from %s (%s)", dest, source, how)
        fd, tmp_name = tempfile.mkstemp(dir=bundle_dir, prefix=f".{name}.", suffix=".tmp")
        os.close(fd)
        try:
            try:
                with quiet_quantizer():
                    DERIVE[how](bundle_dir / source, Path(tmp_name), int(manifest.model["h"]))
            except Exception as e:  # ONNX Runtime's and onnx's errors have no common base: one line, naming the file
                raise DeriveError(f"{dest}: cannot be derived from {source} ({type(e).__name__}: {e})") from e
            os.chmod(tmp_name, 0o644)  # readable as the shipped files are (mkstemp's are the owner's only)
            os.replace(tmp_name, dest)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        derived.append(dest)
    return derived
