"""Which ONNX Runtime execution provider the sessions run on, and its options.

onnxruntime-gpu lists the CUDA execution provider whether or not a GPU is visible (the list says what the package
was built with), so ``auto`` and ``cuda`` ask ONNX Runtime to start CUDA once, on a one-node graph, before any
bundle's sessions: a process that sees no GPU, or lacks a CUDA library, then serves on the CPU (``auto``) or stops
at start-up with the reason (``cuda``).
"""

from __future__ import annotations

import functools
import logging
from typing import Literal

import onnxruntime as ort

log = logging.getLogger(__name__)

Provider = Literal["auto", "cuda", "cpu"]
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
MiB = 1 << 20


class ProviderError(RuntimeError):
    """The requested execution provider is not available."""


def choose_provider(requested: Provider) -> str:
    """auto -> CUDA when onnxruntime-gpu starts CUDA on a GPU, else CPU; cuda without a usable GPU is an error.

    Raises:
        ProviderError: ``cuda`` was requested and ONNX Runtime has no CUDA execution provider, or cannot start it.
    """
    if requested == "cpu":
        return CPU
    available = ort.get_available_providers()
    if CUDA not in available:
        if requested == "cuda":
            raise ProviderError(
                f"ATTNSERVE_PROVIDER=cuda but ONNX Runtime offers only {available}: install onnxruntime-gpu "
                "(instead of onnxruntime) on a machine with an NVIDIA GPU, or set ATTNSERVE_PROVIDER=cpu"
            )
        return CPU
    reason = cuda_unusable()
    if reason is None:
        return CUDA
    if requested == "cuda":
        raise ProviderError(
            f"ATTNSERVE_PROVIDER=cuda but ONNX Runtime cannot start CUDA ({reason}): check that the NVIDIA driver "
            "sees a GPU (nvidia-smi; in a container, the NVIDIA Container Toolkit), or set ATTNSERVE_PROVIDER=auto "
            "to serve on the CPU"
        )
    return CPU


@functools.cache
def cuda_unusable() -> str | None:
    """Why ONNX Runtime cannot run a graph on CUDA here (no GPU visible, a CUDA library missing), or None when it
    can; asked once per process, after CUDA's libraries are preloaded."""
    preload_cuda()
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the probe session's lines: the reason is returned (the environment's stay)
    try:
        # No fallback: a CUDA that fails to start raises here instead of running the probe on the CPU.
        session = ort.InferenceSession(probe_model(), options, providers=[CUDA], enable_fallback=0)
    except Exception as e:  # ONNX Runtime raises RuntimeError, Fail or its other pybind errors: each is a reason
        reason = " ".join(str(e).split())
        log.warning("CUDA execution provider unusable: %s", reason)
        return reason
    providers = session.get_providers()
    if providers[0] != CUDA:  # onnxruntime-gpu logs why (no driver, a library missing) and runs on the CPU
        reason = f"a graph ran on {providers}: ONNX Runtime's log above says why"
        log.warning("CUDA execution provider unusable: %s", reason)
        return reason
    return None


def probe_model() -> bytes:
    """A one-node graph (y = x, one float) that any execution provider runs."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime the service supports reads, whatever onnx writes by default
    serialized: bytes = model.SerializeToString()
    return serialized


@functools.cache
def preload_cuda() -> None:
    """Load CUDA and cuDNN from the nvidia-* wheels pip installed beside onnxruntime-gpu (once per process)."""
    ort.preload_dlls()


def cuda_options(gpu_mem_limit_mb: int = 0) -> dict[str, str]:
    """The CUDA execution provider's options: float32 MatMuls in float32 (no TF32: the attention weights served are
    the model's own) and, when ``gpu_mem_limit_mb`` is not 0, that bound on each session's device memory arena."""
    options = {"use_tf32": "0"}
    if gpu_mem_limit_mb:
        options["gpu_mem_limit"] = str(gpu_mem_limit_mb * MiB)
    return options
