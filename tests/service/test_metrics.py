"""/metrics exposes every metric of the contract, each non-zero after traffic."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.runtime.providers import CPU
from service.serving import models
from tests.service.conftest import ServerFactory

METRICS = [
    "attnserve_requests_total",
    "attnserve_request_duration_seconds_count",
    "attnserve_queue_wait_seconds_count",
    "attnserve_batch_size_count",
    "attnserve_batch_tokens_count",
    "attnserve_inference_seconds_count",
    "attnserve_input_tokens_total",
    "attnserve_generated_tokens_total",
    "attnserve_queue_depth",
    "attnserve_active_sequences",
    "attnserve_queue_capacity",
    "attnserve_rejected_total",
    "attnserve_model_info",
    "attnserve_pairs",
    "attnserve_model_load_seconds_count",
    "attnserve_model_loads_total",
]


def samples(text: str) -> dict[str, float]:
    """Largest value of each metric name over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("attnserve_"):
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{")[0]
            out[name] = max(out.get(name, 0.0), float(value))
    return out


def test_every_metric_is_nonzero_after_traffic(make_server: ServerFactory) -> None:
    server = make_server(max_batch_size=1, queue_size=8, max_wait_ms=10)  # one text at a time: the queue stays full
    body = {"q": "Delete the selected files?", "source": "en", "target": "ja", "max_length": 100}

    async def traffic() -> tuple[list[httpx.Response], dict[str, float]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            load = [asyncio.ensure_future(c.post("/translate", json=body)) for _ in range(30)]
            during: dict[str, float] = {}
            while not all(f.done() for f in load):  # gauges are read while the load is on
                for name, value in samples((await c.get("/metrics")).text).items():
                    during[name] = max(during.get(name, 0.0), value)
                await asyncio.sleep(0.01)
            return list(await asyncio.gather(*load)), during

    responses, during = asyncio.run(traffic())
    assert {r.status_code for r in responses} == {200, 503}
    with server.client() as c:
        c.post("/attention", json={"q": "Open file", "target": "ja"})
        after = samples(c.get("/metrics").text)
    for name in METRICS:
        value = during[name] if name in ("attnserve_queue_depth", "attnserve_active_sequences") else after[name]
        assert value > 0, name
    with server.client() as c:
        info = [ln for ln in c.get("/metrics").text.splitlines() if ln.startswith("attnserve_model_info")]
    assert info == [
        'attnserve_model_info{name="tiny-en-ja",provider="CPUExecutionProvider",source_lang="en",target_lang="ja",'
        'variant="float32"} 1.0'
    ]


def gpu_samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("attnserve_gpu_memory_bytes")]


def test_gpu_memory_only_where_a_bundle_runs_on_cuda(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_server().client() as c:
        assert gpu_samples(c.get("/metrics").text) == []  # the CPU: no series at all

    reads = iter([(3 << 30, 80 << 30), (3 << 30, 80 << 30)])
    monkeypatch.setattr(models, "CUDA", CPU)  # the CPU engine stands in for one on CUDA
    monkeypatch.setattr(models, "device_memory", lambda: next(reads))  # read at scrape time; then it fails
    with make_server().client() as c:
        assert gpu_samples(c.get("/metrics").text) == [
            'attnserve_gpu_memory_bytes{kind="used"} 3.221225472e+09',
            'attnserve_gpu_memory_bytes{kind="total"} 8.589934592e+10',
        ]
        assert gpu_samples(c.get("/metrics").text) == [
            'attnserve_gpu_memory_bytes{kind="used"} NaN',
            'attnserve_gpu_memory_bytes{kind="total"} NaN',
        ]
