"""Weights stored once: every graph's large initializers moved into one shared file of ONNX external data
(``weights.bin``), a tensor that several graphs hold (the decoder's and the fast decoder's, the tied embeddings)
written once and referenced by offset from each."""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from onnx import TensorProto, numpy_helper

WEIGHTS = "weights.bin"
INLINE_BELOW = 1024  # bytes: smaller tensors stay in the graph, as onnx's own external-data writer keeps them
PAGE = 4096  # offsets of large tensors on page boundaries, so that ONNX Runtime can map them
PAGE_FROM = 1 << 16  # bytes: smaller tensors are aligned to ALIGN only
ALIGN = 64


def _external(tensor: TensorProto, offset: int, length: int) -> None:
    """Point ``tensor`` at ``length`` bytes of WEIGHTS from ``offset``, its data removed from the graph."""
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", WEIGHTS), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def store_weights_once(bundle_dir: Path, names: list[str]) -> int:
    """Rewrite the graphs ``names`` of ``bundle_dir`` with their initializers of INLINE_BELOW bytes or more in one
    WEIGHTS file, each distinct content once, in the order of ``names`` and of each graph's initializers (the
    same graphs give the same bytes). The graphs may already point into WEIGHTS: they are read whole first.

    Returns:
        The size of WEIGHTS in bytes.
    """
    graphs = [onnx.load(str(bundle_dir / name)) for name in names]  # external data read in, so WEIGHTS can go
    offsets: dict[bytes, int] = {}
    data = bytearray()
    for graph in graphs:
        for tensor in graph.graph.initializer:
            raw = numpy_helper.to_array(tensor).tobytes()
            if len(raw) < INLINE_BELOW:
                continue
            key = hashlib.sha256(raw).digest()
            if key not in offsets:
                align = PAGE if len(raw) >= PAGE_FROM else ALIGN
                data.extend(b"\0" * (-len(data) % align))
                offsets[key] = len(data)
                data.extend(raw)
            for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            _external(tensor, offsets[key], len(raw))
    (bundle_dir / WEIGHTS).write_bytes(bytes(data))
    for name, graph in zip(names, graphs, strict=True):
        onnx.save(graph, str(bundle_dir / name))
    return len(data)
