"""One graph under construction with the ``onnx`` package's helper API: nodes, the model's weights as initializers
under their state-dict names (``model.`` first, as the bundle's graphs have always named them), small constants,
and typed inputs and outputs whose dynamic axes come from :mod:`model.export.names`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model.config import TransformerConfig
from service.runtime.kernels import KERNELS

OPSET = 17
IR_VERSION = 8  # what ONNX Runtime 1.16 and later load; the bundles' graphs have always had it
FLOAT, INT64, INT32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
Dims = list[int | None]  # a value's shape: None where names.py gives the axis a name


def weight_key(c: TransformerConfig, key: str) -> str:
    """The state-dict key that holds ``key``'s tensor: tied embeddings are one matrix, the source embedding's."""
    if c.tie_embeddings and key in ("tgt_embed.lut.weight", "generator.proj.weight"):
        return "src_embed.lut.weight"
    return key


class Graph:
    """Nodes and initializers of one graph; :meth:`model` puts them together.

    Args:
        c: the model's config.
        weights: state-dict key -> array (a state dict's, numpy).
        axes: the graph's dynamic axes, value name -> {axis: name} (:mod:`model.export.names`).
    """

    def __init__(self, c: TransformerConfig, weights: dict[str, np.ndarray], axes: dict[str, dict[int, str]]):
        self.c, self.weights, self.axes = c, weights, axes
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []
        self._constants: dict[tuple[str, bytes, tuple[int, ...]], str] = {}
        self._constant_nodes: set[str] = set()

    def op(self, op_type: str, *inputs: str, outputs: int | list[str] = 1, domain: str = "", **attrs: Any) -> Any:
        """Add a node; returns its output name (a list of them for several or named ``outputs``)."""
        index = len(self.nodes)
        names = outputs if isinstance(outputs, list) else [f"{op_type}_{index}.{i}" for i in range(outputs)]
        node = helper.make_node(op_type, list(inputs), names, name=f"{op_type}_{index}", domain=domain, **attrs)
        self.nodes.append(node)
        return names[0] if len(names) == 1 and not isinstance(outputs, list) else names

    def custom(self, op_type: str, *inputs: str, outputs: int | list[str] = 1, elem: int = FLOAT) -> Any:
        """A node of attnserve's own kernels (service/runtime/_attention.c), its outputs typed ``elem``: ONNX's
        shape inference knows no custom op, and the quantizer needs the types of what follows."""
        out = self.op(op_type, *inputs, outputs=outputs, domain=KERNELS)
        names = [out] if isinstance(out, str) else out
        self.value_info.extend(helper.make_tensor_value_info(n, elem, None) for n in names)
        return out

    def weight(self, key: str) -> str:
        """The initializer of the state-dict weight ``key`` (its tied twin's, see :func:`weight_key`)."""
        key = weight_key(self.c, key)
        name = "model." + key
        if name not in self.initializers:
            self.initializers[name] = np.asarray(self.weights[key], np.float32)
        return name

    def array(self, name: str, value: np.ndarray) -> str:
        """An initializer ``name`` holding ``value`` (a tensor of the graph's own, not the model's)."""
        self.initializers[name] = value
        return name

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """A small constant as an initializer, one per distinct value."""
        array = np.asarray(value, dtype)
        key = (array.dtype.str, array.tobytes(), array.shape)
        if key not in self._constants:
            self._constants[key] = self.array(f"const.{len(self._constants)}", array)
        return self._constants[key]

    def constant(self, name: str, make: Callable[[], np.ndarray]) -> str:
        """A Constant node ``name`` of the array ``make`` gives, made once: a tensor in the graph itself, never in
        the weights file (which stores the model's weights only, as float16 where the bundle stores them so)."""
        if name not in self._constant_nodes:
            self._constant_nodes.add(name)
            self.op("Constant", outputs=[name], value=numpy_helper.from_array(make(), name))
        return name

    def _value(self, name: str, elem: int, dims: Dims) -> onnx.ValueInfoProto:
        axes = self.axes.get(name, {})
        shape = [axes[i] if d is None else d for i, d in enumerate(dims)]
        return helper.make_tensor_value_info(name, elem, shape)

    def input(self, name: str, elem: int, dims: Dims) -> str:
        self.inputs.append(self._value(name, elem, dims))
        return name

    def output(self, value: str, name: str, elem: int, dims: Dims) -> None:
        """Declare graph output ``name``; ``value`` is renamed where it is made (an Identity where it is an input)."""
        if value != name:
            renamed = False
            for node in self.nodes:
                for i, out in enumerate(node.output):
                    if out == value:
                        node.output[i] = name
                        renamed = True
                for i, inp in enumerate(node.input):
                    if inp == value:
                        node.input[i] = name
            if not renamed:
                self.op("Identity", value, outputs=[name])
        self.outputs.append(self._value(name, elem, dims))

    def model(self, name: str) -> onnx.ModelProto:
        domains = {node.domain for node in self.nodes} - {""}
        outputs = {o.name for o in self.outputs}
        opsets = [helper.make_opsetid("", OPSET), *(helper.make_opsetid(d, 1) for d in sorted(domains))]
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs,
                                  value_info=[v for v in self.value_info if v.name not in outputs])  # fmt: skip
        for array_name, array in self.initializers.items():  # one copy of each weight's bytes: no proto copied
            tensor = graph.initializer.add()
            tensor.name, tensor.data_type = array_name, helper.np_dtype_to_tensor_dtype(array.dtype)
            tensor.dims.extend(array.shape)
            tensor.raw_data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name="attnserve")
