"""The execution provider: CUDA only where ONNX Runtime starts it, the CPU otherwise; the CUDA options."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from service.runtime import providers
from service.runtime.providers import CPU, CUDA, ProviderError, choose_provider, cuda_options


@pytest.fixture(autouse=True)
def fresh_probe() -> Iterator[None]:
    """Each test asks ONNX Runtime again (the answer is kept for the process)."""
    providers.cuda_unusable.cache_clear()
    yield
    providers.cuda_unusable.cache_clear()


@pytest.fixture
def gpu_package_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime-gpu on a machine with no visible GPU: CUDA is listed, but no session can run on it."""
    if CUDA in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has a CUDA execution provider")
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])


def test_the_cpu_package_serves_on_the_cpu() -> None:
    if CUDA in ort.get_available_providers():
        pytest.skip("this ONNX Runtime has a CUDA execution provider")
    with pytest.raises(ProviderError, match="install onnxruntime-gpu"):
        choose_provider("cuda")
    assert choose_provider("auto") == CPU
    assert choose_provider("cpu") == CPU


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
@pytest.mark.usefixtures("gpu_package_without_a_gpu")
def test_auto_serves_on_the_cpu_when_cuda_cannot_start() -> None:
    assert providers.cuda_unusable() is not None
    assert choose_provider("auto") == CPU


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
@pytest.mark.usefixtures("gpu_package_without_a_gpu")
def test_cuda_requested_where_it_cannot_start_stops_with_the_reason() -> None:
    with pytest.raises(ProviderError, match=r"cannot start CUDA .*ATTNSERVE_PROVIDER=auto"):
        choose_provider("cuda")


def test_the_probe_is_a_graph_every_supported_onnx_runtime_reads() -> None:
    model = providers.probe_model()
    assert onnx.load_from_string(model).ir_version <= 8  # ONNX Runtime 1.24's IR 10 and older read it
    session = ort.InferenceSession(model, providers=[CPU])
    assert session.run(None, {"x": np.array([2.0], np.float32)})[0].tolist() == [2.0]


def test_cpu_is_chosen_without_asking_onnx_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "cuda_unusable", lambda: pytest.fail("CUDA was probed for provider=cpu"))
    assert choose_provider("cpu") == CPU


def test_cuda_options_keep_float32_and_bound_the_arena_in_bytes() -> None:
    assert cuda_options() == {"use_tf32": "0"}
    assert cuda_options(512) == {"use_tf32": "0", "gpu_mem_limit": str(512 * 1024 * 1024)}
