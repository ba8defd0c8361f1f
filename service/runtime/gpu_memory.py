"""The CUDA device's memory, read through the CUDA runtime that ONNX Runtime's CUDA execution provider loaded.

ONNX Runtime's Python API gives no statistic of its CUDA arenas (the C API's ``AllocatorGetStats`` needs a session
handle that Python never sees), so /metrics reads ``cudaMemGetInfo`` of the process's own ``libcudart``: the
device's used memory, which on a GPU serving one process is that process's (the arenas, which never shrink, and
the CUDA context). No library beyond the ones onnxruntime-gpu loads, and no NVML, whose per-process figures
containers hide.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

MAPS = Path("/proc/self/maps")


class GpuMemoryError(RuntimeError):
    """The device's memory cannot be read (no CUDA runtime loaded, or CUDA reports an error)."""


def loaded_library(stem: str, maps: Path = MAPS) -> str | None:
    """The path of the first library named ``stem`` (``libcudart.so``, any version) mapped into this process."""
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, and the path if any
        if len(fields) == 6 and Path(fields[5]).name.startswith(stem):
            return fields[5]
    return None


@functools.cache
def cuda_runtime() -> ctypes.CDLL:
    """The CUDA runtime this process loaded (once found, kept).

    Raises:
        GpuMemoryError: no ``libcudart`` is loaded: nothing runs on CUDA here.
    """
    path = loaded_library("libcudart.so")
    if path is None:
        raise GpuMemoryError("no CUDA runtime (libcudart) is loaded in this process")
    library = ctypes.CDLL(path)
    library.cudaSetDevice.argtypes = [ctypes.c_int]
    library.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    return library


def device_memory(device: int = 0) -> tuple[int, int]:
    """(used, total) bytes of CUDA device ``device`` (ONNX Runtime's default device is 0).

    Raises:
        GpuMemoryError: no CUDA runtime is loaded, or CUDA returned an error (its code in the message).
    """
    cuda = cuda_runtime()
    status = cuda.cudaSetDevice(device)  # this thread's device: its primary context, the one ONNX Runtime uses
    if status != 0:
        raise GpuMemoryError(f"cudaSetDevice({device}) returned CUDA error {status}")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    status = cuda.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    if status != 0:
        raise GpuMemoryError(f"cudaMemGetInfo returned CUDA error {status}")
    return total.value - free.value, total.value
