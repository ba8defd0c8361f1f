"""CTranslate2's ``model.bin`` read with numpy: version, spec, named variables and aliases, every size checked.

The layout is what CTranslate2's ``specs/model_spec.py`` writes and ``src/models/model.cc`` reads (binary versions 4
to 6): a uint32 version, the spec's name and a uint32 revision, a uint32 count of variables, each a name, a uint8
rank, rank uint32 dimensions, a uint8 type id, a uint32 byte count and the bytes; then a uint32 count of aliases, each
two names. A name is a uint16 length (its closing NUL included), the UTF-8 bytes and a NUL. Integers are
little-endian. Flags such as ``encoder/pre_norm`` are scalar variables.

:meth:`ModelBin.float32` gives a weight as CTranslate2 computes with it under ``compute_type="float32"``: int8 rows
times the float32 reciprocal of their ``<name>_scale`` (``ops/dequantize_cpu.cc`` multiplies by ``1.f / scale``;
dividing differs in the last bit), float16 and bfloat16 widened exactly.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VERSIONS = range(4, 7)  # dtype ids and aliases exist from version 4; CTranslate2 writes 6
DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # the type ids of include/ctranslate2/types.h
ITEM_SIZE = {"float32": 4, "int8": 1, "int16": 2, "int32": 4, "float16": 2, "bfloat16": 2}
MAX_RANK = 8


class ModelBinError(ValueError):
    """A model.bin that is truncated, inconsistent or of a kind this reader does not know; one line says which."""


@dataclass(frozen=True)
class Variable:
    """One named variable as stored: its shape, type and raw little-endian bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: bytes

    def array(self) -> np.ndarray:
        """The stored values, typed (bfloat16 widened to float32, exactly)."""
        if self.dtype == "bfloat16":
            bits = np.frombuffer(self.data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(self.shape)
        return np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<")).reshape(self.shape)


@dataclass(frozen=True)
class ModelBin:
    """A parsed model.bin."""

    version: int
    spec: str
    revision: int
    variables: dict[str, Variable]
    aliases: dict[str, str]  # alias -> the variable it names

    def names(self) -> set[str]:
        """Every name a variable can be read by: the variables' and the aliases'."""
        return set(self.variables) | set(self.aliases)

    def get(self, name: str) -> Variable:
        """The variable ``name`` names, through an alias if it is one.

        Raises:
            ModelBinError: no such variable.
        """
        target = self.aliases.get(name, name)
        if target not in self.variables:
            raise ModelBinError(f"model.bin has no variable {name}")
        return self.variables[target]

    def scalar(self, name: str, default: float | None = None) -> float:
        """A scalar flag or attribute (``encoder/pre_norm``, ``decoder/num_heads``); ``default`` when absent.

        Raises:
            ModelBinError: it is absent without a default, or not a scalar.
        """
        if name not in self.names() and default is not None:
            return default
        var = self.get(name)
        if var.shape != ():
            raise ModelBinError(f"model.bin: {name} has shape {list(var.shape)}, expected a scalar")
        return float(var.array())

    def float32(self, name: str) -> np.ndarray:
        """A variable as float32, as CTranslate2 computes with it under ``compute_type="float32"``.

        Raises:
            ModelBinError: an integer variable without a valid ``<name>_scale``.
        """
        var = self.get(name)
        if var.dtype in ("float32", "float16", "bfloat16"):
            return var.array().astype(np.float32)
        scale_name = self.aliases.get(name, name) + "_scale"
        if var.dtype == "int8":
            scale = self._scale(scale_name, (var.shape[0],) if var.shape else None)
            return var.array().astype(np.float32) * (np.float32(1.0) / scale).reshape(-1, *[1] * (len(var.shape) - 1))
        if var.dtype == "int16":
            return var.array().astype(np.float32) * (np.float32(1.0) / self._scale(scale_name, ()))
        raise ModelBinError(f"model.bin: {name} is {var.dtype}, not a weight")

    def _scale(self, name: str, shape: tuple[int, ...] | None) -> np.ndarray:
        if name not in self.variables:
            raise ModelBinError(f"model.bin: {name.removesuffix('_scale')} is quantized but has no {name}")
        scale = self.variables[name]
        if scale.dtype != "float32" or scale.shape != shape:
            raise ModelBinError(f"model.bin: {name} is {scale.dtype} {list(scale.shape)}, expected float32 {shape}")
        values = scale.array()
        if not np.all(np.isfinite(values)) or np.any(values == 0):
            raise ModelBinError(f"model.bin: {name} holds a zero or non-finite scale")
        return values


class _Cursor:
    """Reads little-endian fields from bytes; reading past the end is a :class:`ModelBinError`."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int, what: str) -> bytes:
        if self.at + n > len(self.data):
            raise ModelBinError(
                f"model.bin is truncated: {what} needs {n} bytes at offset {self.at}, the file has {len(self.data)}"
            )
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def uint(self, fmt: str, what: str) -> int:
        value: int = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def string(self, what: str) -> str:
        n = self.uint("H", f"the length of {what}")
        if n == 0:
            raise ModelBinError(f"model.bin: {what} at offset {self.at - 2} has length 0")
        raw = self.take(n, what)
        if raw[-1] != 0 or 0 in raw[:-1]:
            raise ModelBinError(f"model.bin: {what} at offset {self.at - n} is not one NUL-terminated string")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise ModelBinError(f"model.bin: {what} at offset {self.at - n} is not UTF-8") from None


def _variable(cur: _Cursor, index: int) -> Variable:
    name = cur.string(f"the name of variable {index}")
    rank = cur.uint("B", f"the rank of {name}")
    if rank > MAX_RANK:
        raise ModelBinError(f"model.bin: {name} has rank {rank}, more than {MAX_RANK}")
    shape = tuple(cur.uint("I", f"a dimension of {name}") for _ in range(rank))
    type_id = cur.uint("B", f"the type of {name}")
    if type_id >= len(DTYPES):
        raise ModelBinError(f"model.bin: {name} has unknown type id {type_id}")
    dtype = DTYPES[type_id]
    size = cur.uint("I", f"the byte count of {name}")
    expected = int(np.prod(shape, dtype=np.int64)) * ITEM_SIZE[dtype]
    if size != expected:
        raise ModelBinError(
            f"model.bin: {name} declares {size} bytes, its shape {list(shape)} of {dtype} is {expected}"
        )
    return Variable(name, shape, dtype, cur.take(size, f"the values of {name}"))


def parse_model_bin(data: bytes) -> ModelBin:
    """Parse the bytes of a model.bin.

    Raises:
        ModelBinError: an unsupported version, a truncated or inconsistent field, a duplicate name, an alias to
            nothing, or bytes after the aliases.
    """
    cur = _Cursor(data)
    version = cur.uint("I", "the binary version")
    if version not in VERSIONS:
        raise ModelBinError(f"model.bin binary version {version}; this reader reads {VERSIONS[0]} to {VERSIONS[-1]}")
    spec = cur.string("the spec name")
    revision = cur.uint("I", "the spec revision")
    variables: dict[str, Variable] = {}
    for i in range(cur.uint("I", "the variable count")):
        var = _variable(cur, i)
        if var.name in variables:
            raise ModelBinError(f"model.bin: variable {var.name} appears twice")
        variables[var.name] = var
    aliases: dict[str, str] = {}
    for i in range(cur.uint("I", "the alias count")):
        alias, target = cur.string(f"alias {i}"), cur.string(f"the target of alias {i}")
        if alias in variables or alias in aliases:
            raise ModelBinError(f"model.bin: alias {alias} names an existing variable or alias")
        if target not in variables:
            raise ModelBinError(f"model.bin: alias {alias} points to {target}, which is not a variable")
        aliases[alias] = target
    if cur.at != len(data):
        raise ModelBinError(f"model.bin has {len(data) - cur.at} bytes after its aliases (offset {cur.at})")
    return ModelBin(version, spec, revision, variables, aliases)


def read_model_bin(path: Path) -> ModelBin:
    """Read and parse ``path`` (:func:`parse_model_bin`).

    Raises:
        ModelBinError: as :func:`parse_model_bin`, or the file is missing.
    """
    if not path.is_file():
        raise ModelBinError(f"{path}: no such file")
    return parse_model_bin(path.read_bytes())
