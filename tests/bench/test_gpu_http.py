"""bench/gpu_http.py: what it reads from /metrics, the gauge as the service's metrics module writes it."""

from __future__ import annotations

import gpu_http

from service.metrics import Metrics


def test_the_gpu_memory_gauge_and_the_provider_are_read_from_metrics() -> None:
    metrics = Metrics()
    metrics.model_info.labels("en-ja", "en", "ja", "CUDAExecutionProvider", "float32").set(1)
    assert gpu_http.read_metrics(metrics.render().decode()) == {
        "gpu_memory_bytes": None,  # no bundle on CUDA has asked for it
        "provider": ["CUDAExecutionProvider"],
    }
    metrics.track_gpu_memory(lambda: (3 << 30, 80 << 30))
    assert gpu_http.read_metrics(metrics.render().decode())["gpu_memory_bytes"] == {
        "used": float(3 << 30),
        "total": float(80 << 30),
    }
