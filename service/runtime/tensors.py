"""The key/value caches' kinds of array and the few operations batching needs on them (take rows, append rows, pad,
narrow, put), so the decoder never looks inside a cache: numpy arrays on the host, or ONNX Runtime values that stay
on the execution provider's device (IOBinding)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

Cache = Any  # np.ndarray (host) or ort.OrtValue (IOBinding): one layer's keys or values, (B, h, T, d_k)


class Tensors(Protocol):
    """The operations batching needs on caches; every result is contiguous, and a new cache but for ``put``."""

    def empty(self, shape: tuple[int, ...]) -> Cache: ...
    def shape(self, x: Cache) -> tuple[int, ...]: ...
    def take(self, x: Cache, rows: np.ndarray) -> Cache: ...  # x[rows]
    def cat(self, x: Cache, y: Cache) -> Cache: ...  # x and y's rows
    def pad(self, x: Cache, axis: int, n: int, front: bool = False) -> Cache: ...  # n zeros added along axis
    def narrow(self, x: Cache, axis: int, start: int, stop: int) -> Cache: ...  # x[start:stop] along axis
    # x with x[rows] = y (host: in place); y is zero-padded along axis 2 when it is shorter there
    def put(self, x: Cache, rows: np.ndarray, y: Cache) -> Cache: ...


class HostTensors:
    """Caches as numpy arrays."""

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, np.float32)

    def shape(self, x: np.ndarray) -> tuple[int, ...]:
        return tuple(x.shape)

    def take(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        taken: np.ndarray = x[rows]
        return taken

    def cat(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.concatenate([x, y])

    def pad(self, x: np.ndarray, axis: int, n: int, front: bool = False) -> np.ndarray:
        if n == 0:
            return x
        shape = list(x.shape)
        shape[axis] += n
        out = np.zeros(shape, x.dtype)  # np.pad costs tens of microseconds more per call
        index = [slice(0, size) for size in x.shape]
        if front:
            index[axis] = slice(n, None)
        out[tuple(index)] = x
        return out

    def narrow(self, x: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return np.ascontiguousarray(x[tuple(index)])

    def put(self, x: np.ndarray, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
        if y.ndim > 2 and y.shape[2] < x.shape[2]:  # without a padded copy of y
            x[rows, :, : y.shape[2]] = y
            x[rows, :, y.shape[2] :] = 0
        else:
            x[rows] = y
        return x


class DeviceTensors:
    """Caches as ONNX Runtime values on the execution provider's device; each operation is a one-node ONNX graph
    run there with IOBinding, so a cache never leaves the device. The graphs are typed for the caches' ``dtype``
    (float32, or float16 for a float16 decoder's caches)."""

    def __init__(
        self, providers: list[Any], device: str, options: ort.SessionOptions, dtype: type[np.floating] = np.float32
    ) -> None:
        from onnx import TensorProto, helper

        self.device = device
        self.dtype = dtype
        f, i = (TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT), TensorProto.INT64

        def session(op: str, inputs: list[tuple[str, int]], **attributes: Any) -> ort.InferenceSession:
            node = helper.make_node(op, [name for name, _ in inputs], ["y"], **attributes)
            graph = helper.make_graph(
                [node],
                op,
                [helper.make_tensor_value_info(name, kind, None) for name, kind in inputs],
                [helper.make_tensor_value_info("y", f, None)],
            )
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 8
            return ort.InferenceSession(model.SerializeToString(), options, providers=providers)

        self._take = session("Gather", [("x", f), ("rows", i)], axis=0)
        self._cat = session("Concat", [("x", f), ("z", f)], axis=0)
        self._pad = session("Pad", [("x", f), ("pads", i)])
        self._slice = session("Slice", [("x", f), ("starts", i), ("ends", i), ("axes", i)])
        self._put = session("ScatterND", [("x", f), ("rows", i), ("z", f)])
        self._convert = session("Cast", [("x", TensorProto.FLOAT)], to=f)

    def _run(self, session: ort.InferenceSession, x: ort.OrtValue, **host: np.ndarray) -> ort.OrtValue:
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", x)
        for name, value in host.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, value)
        binding.bind_output("y", self.device)
        session.run_with_iobinding(binding)
        out: ort.OrtValue = binding.get_outputs()[0]
        return out

    def empty(self, shape: tuple[int, ...]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.dtype), self.device, 0)

    def convert(self, x: ort.OrtValue) -> ort.OrtValue:
        """A float32 value (an encoder's cross keys or values) in the caches' dtype."""
        return x if self.dtype == np.float32 else self._run(self._convert, x)

    def shape(self, x: ort.OrtValue) -> tuple[int, ...]:
        return tuple(x.shape())

    def take(self, x: ort.OrtValue, rows: np.ndarray) -> ort.OrtValue:
        return self._run(self._take, x, rows=np.asarray(rows, np.int64))

    def cat(self, x: ort.OrtValue, y: ort.OrtValue) -> ort.OrtValue:
        return self._run(self._cat, x, z=y)

    def pad(self, x: ort.OrtValue, axis: int, n: int, front: bool = False) -> ort.OrtValue:
        if n == 0:
            return x
        rank = len(x.shape())
        pads = np.zeros(2 * rank, np.int64)  # ONNX Pad: every axis's leading counts, then its trailing ones
        pads[axis if front else rank + axis] = n
        return self._run(self._pad, x, pads=pads)

    def narrow(self, x: ort.OrtValue, axis: int, start: int, stop: int) -> ort.OrtValue:
        def one(v: int) -> np.ndarray:
            return np.array([v], np.int64)

        return self._run(self._slice, x, starts=one(start), ends=one(stop), axes=one(axis))

    def put(self, x: ort.OrtValue, rows: np.ndarray, y: ort.OrtValue) -> ort.OrtValue:
        length, short = x.shape(), y.shape()
        if len(short) > 2 and short[2] < length[2]:
            y = self.pad(y, 2, length[2] - short[2])
        return self._run(self._put, x, rows=np.asarray(rows, np.int64)[:, None], z=y)
