"""The CUDA device's memory through the process's CUDA runtime: a stand-in libcudart, built here with the C compiler
the project builds with, answers as CUDA's does (the same two calls, sizes through pointers, error codes)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.runtime import gpu_memory
from service.runtime.gpu_memory import GpuMemoryError, device_memory, loaded_library

STAND_IN = r"""
#include <stddef.h>
int status = 0, device = -1;
int cudaSetDevice(int d) { device = d; return 0; }
int cudaMemGetInfo(size_t *free, size_t *total) {
    if (status) return status;
    *free = (size_t)5 << 30; *total = (size_t)80 << 30;
    return 0;
}
"""


@pytest.fixture(scope="module")
def cudart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ctypes.CDLL]:
    """The stand-in, loaded into this process as libcudart.so.13."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler (the project's C extensions need one too)")
    directory = tmp_path_factory.mktemp("cudart")
    (directory / "cudart.c").write_text(STAND_IN)
    library = directory / "libcudart.so.13"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(directory / "cudart.c")], check=True)
    gpu_memory.cuda_runtime.cache_clear()
    yield ctypes.CDLL(str(library))
    gpu_memory.cuda_runtime.cache_clear()


def test_no_cuda_runtime_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 fd:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n"
        "7f0000002000-7f0000003000 rw-p 00000000 00:00 0\n"
    )
    monkeypatch.setattr(gpu_memory, "loaded_library", lambda stem: loaded_library(stem, maps))
    gpu_memory.cuda_runtime.cache_clear()
    with pytest.raises(GpuMemoryError, match="no CUDA runtime"):
        device_memory()
    gpu_memory.cuda_runtime.cache_clear()


def test_a_mapped_library_is_found_by_name_whatever_its_version(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    path = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13"
    maps.write_text(f"7f0000000000-7f0000001000 r-xp 00000000 fd:01 77 {path}\n")
    assert loaded_library("libcudart.so", maps) == path
    assert loaded_library("libcublas.so", maps) is None


def test_used_and_total_from_the_loaded_runtime(cudart: ctypes.CDLL) -> None:
    assert device_memory() == ((80 - 5) << 30, 80 << 30)
    assert ctypes.c_int.in_dll(cudart, "device").value == 0  # ONNX Runtime's default device


def test_a_cuda_error_names_its_call_and_code(cudart: ctypes.CDLL) -> None:
    ctypes.c_int.in_dll(cudart, "status").value = 100  # cudaErrorNoDevice
    try:
        with pytest.raises(GpuMemoryError, match="cudaMemGetInfo returned CUDA error 100"):
            device_memory()
    finally:
        ctypes.c_int.in_dll(cudart, "status").value = 0
