"""Weights stored once: every graph's large initializers moved into one shared file of ONNX external data
(``weights.bin``), a tensor that several graphs hold (the decoder's and the fast decoder's, the tied embeddings)
written once and referenced by offset from each.

Stored as float16 (``float16=True``), each such float32 tensor is kept as float16 under ``<name>`` +
:data:`FLOAT16_SUFFIX` and a ``Cast`` to float32 named ``<name>`` opens the graph: ONNX Runtime folds the casts when
it loads the graph, so the weights and every computation stay float32 and the file is half the size."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHTS = "weights.bin"
INLINE_BELOW = 1024  # bytes: smaller tensors stay in the graph, as onnx's own external-data writer keeps them
PAGE = 4096  # offsets of large tensors on page boundaries, so that ONNX Runtime can map them
PAGE_FROM = 1 << 16  # bytes: smaller tensors are aligned to ALIGN only
ALIGN = 64
FLOAT16_SUFFIX = ".float16"


def _external(tensor: TensorProto, offset: int, length: int) -> None:
    """Point ``tensor`` at ``length`` bytes of WEIGHTS from ``offset``, its data removed from the graph."""
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", WEIGHTS), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _cast(graph: onnx.ModelProto, tensor: TensorProto) -> None:
    """Store a float32 initializer as float16 behind a Cast of the same name, first in the graph."""
    name = tensor.name
    tensor.name = name + FLOAT16_SUFFIX
    tensor.data_type = TensorProto.FLOAT16
    cast = helper.make_node("Cast", [tensor.name], [name], name=f"cast{FLOAT16_SUFFIX}.{name}", to=TensorProto.FLOAT)
    graph.graph.node.insert(0, cast)


def _exact_half(tensor: TensorProto) -> np.ndarray:
    """A float32 initializer's values as float16, which must hold them exactly."""
    array = numpy_helper.to_array(tensor)
    half = array.astype(np.float16)
    if not np.array_equal(half.astype(np.float32), array):
        raise ValueError(f"{tensor.name}: float16 does not hold these weights exactly; round them first")
    return half


def stored_float16(graph_path: Path) -> bool:
    """Whether the graph at ``graph_path`` stores its weights as float16 behind casts (see the module's docstring)."""
    graph = onnx.load(str(graph_path), load_external_data=False).graph
    return any(t.name.endswith(FLOAT16_SUFFIX) and t.data_type == TensorProto.FLOAT16 for t in graph.initializer)


def store_weights_once(bundle_dir: Path, names: list[str], float16: bool = False) -> int:
    """Rewrite the graphs ``names`` of ``bundle_dir`` with their initializers of INLINE_BELOW bytes or more in one
    WEIGHTS file, each distinct content once, in the order of ``names`` and of each graph's initializers (the
    same graphs give the same bytes). The graphs may already point into WEIGHTS: they are read whole first.

    Args:
        bundle_dir: the bundle directory.
        names: its graph files.
        float16: store float32 weights as float16 (see the module's docstring); they must be float16 values.

    Returns:
        The size of WEIGHTS in bytes.

    Raises:
        ValueError: ``float16`` and a weight that float16 does not hold exactly.
    """
    graphs = [onnx.load(str(bundle_dir / name)) for name in names]  # external data read in, so WEIGHTS can go
    offsets: dict[Any, Any] = {}
    data = bytearray()
    for graph in graphs:
        store_tensors(graph, data, offsets, float16)
    (bundle_dir / WEIGHTS).write_bytes(bytes(data))
    for name, graph in zip(names, graphs, strict=True):
        onnx.save(graph, str(bundle_dir / name))
    return len(data)


def add_weights(bundle_dir: Path, names: list[str], float16: bool = False) -> int:
    """Move the large initializers of the graphs ``names``, new to the bundle, into its WEIGHTS file as
    :func:`store_weights_once` would, without writing the rest again: a tensor whose content the file holds
    already (at an offset some other graph of the bundle points at) is pointed at there, the others appended.
    Every other file keeps its bytes, and the file its first bytes.

    Returns:
        The size of WEIGHTS in bytes.

    Raises:
        ValueError: ``float16`` and a weight that float16 does not hold exactly.
    """
    data = bytearray((bundle_dir / WEIGHTS).read_bytes())
    offsets: dict[Any, Any] = {}
    for path in sorted(set(bundle_dir.glob("*.onnx")) - {bundle_dir / name for name in names}):
        for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
            where = {entry.key: entry.value for entry in tensor.external_data}
            if tensor.data_location == TensorProto.EXTERNAL and where.get("location") == WEIGHTS:
                offset, length = int(where["offset"]), int(where["length"])
                offsets.setdefault(hashlib.sha256(data[offset : offset + length]).digest(), offset)
    for name in names:
        graph = onnx.load(str(bundle_dir / name))
        store_tensors(graph, data, offsets, float16)
        onnx.save(graph, str(bundle_dir / name))
    (bundle_dir / WEIGHTS).write_bytes(bytes(data))
    return len(data)


def store_tensors(graph: onnx.ModelProto, data: bytearray, offsets: dict[Any, Any], float16: bool) -> None:
    """Point ``graph``'s initializers of INLINE_BELOW bytes or more (float16 behind casts, with ``float16``) into
    ``data``, the WEIGHTS file being written: at the offset of the same content, or appended. ``offsets`` maps each
    content hash to its offset, and each (name, type, shape) seen to its content hash: within one bundle a name holds
    one tensor, so a weight that another graph stored is neither read nor hashed again."""
    for tensor in graph.graph.initializer:
        size = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * math.prod(tensor.dims)
        if size < INLINE_BELOW:
            continue
        to_half = float16 and tensor.data_type == TensorProto.FLOAT
        length = size // 2 if to_half else size
        if length < INLINE_BELOW:  # stays in the graph as float16, as the builder's float16 weights of that size do
            half = _exact_half(tensor)
            _cast(graph, tensor)
            tensor.ClearField("float_data")
            tensor.raw_data = half.tobytes()
            continue
        named = (tensor.name, tensor.data_type, tuple(tensor.dims), to_half)
        if named in offsets:
            if to_half:
                _cast(graph, tensor)
        else:
            array = _exact_half(tensor) if to_half else numpy_helper.to_array(tensor)
            if to_half:
                _cast(graph, tensor)
            raw = array.tobytes()
            key = hashlib.sha256(raw).digest()
            offsets[named] = key
            if key not in offsets:
                align = PAGE if len(raw) >= PAGE_FROM else ALIGN
                data.extend(b"\0" * (-len(data) % align))
                offsets[key] = len(data)
                data.extend(raw)
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            tensor.ClearField(field)
        _external(tensor, offsets[offsets[named]], length)
