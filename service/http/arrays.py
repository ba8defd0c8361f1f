"""How /attention's arrays travel: as JSON lists (bertviz's layout, the default), or as compact typed arrays.

A compact array is ``{"dtype", "shape", "data"}`` with ``data`` the C-order little-endian bytes in base64:
``float16`` keeps about three significant digits; ``uint8`` stores round(weight × 255), so a weight is ``byte ×
scale`` within half a step (``scale`` = 1/255). Either is a few times smaller than JSON before compression and
much smaller after it (attention is mostly near zero).
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

Encoding = Literal["json", "float16", "uint8"]
UINT8_SCALE = 1 / 255


def encode(weights: npt.NDArray[np.float64], encoding: Encoding) -> Any:
    """One kind's [layer][head][query][key] weights as ``encoding`` asks; JSON lists stay a numpy array, which the
    response serializer writes as nested lists."""
    if encoding == "json":
        return np.ascontiguousarray(
            weights
        )  # orjson writes C-order arrays only (a layer or head picked out may not be)
    shape = list(weights.shape)
    if encoding == "float16":
        return {"dtype": "float16", "shape": shape, "data": _base64(weights.astype("<f2"))}
    return {
        "dtype": "uint8",
        "scale": UINT8_SCALE,
        "shape": shape,
        "data": _base64(np.rint(weights / UINT8_SCALE).astype(np.uint8)),
    }


def _base64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode()


def decode(array: Any) -> npt.NDArray[np.float32]:
    """A kind's weights back as float32, from any encoding (what a client does; the tests use it)."""
    if isinstance(array, list):
        return np.asarray(array, np.float32)
    data = base64.b64decode(array["data"])
    if array["dtype"] == "float16":
        return np.frombuffer(data, "<f2").astype(np.float32).reshape(array["shape"])
    return (np.frombuffer(data, np.uint8) * np.float32(array["scale"])).reshape(array["shape"])
