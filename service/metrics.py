"""Every Prometheus metric of the service, in one place: the only module that imports prometheus_client.

Names and labels are the contract in docs/ARCHITECTURE.md (prefix ``attnserve_``); label sets are small and fixed.
The serving metrics carry ``pair`` (``en-de``: service.serving.catalog.pair_label), whose values are the pairs
served, and ``""`` for a refusal before the request's pair is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import NamedTuple

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from service.serving.restoring import PATHS
from service.serving.scheduler import StepStats

ENDPOINTS = ("translate", "attention", "languages", "other")
REJECT_REASONS = (
    "queue_full",
    "deadline",
    "too_large",
    "invalid",
    "auth",
    "rate_limited",
    "key_limited",
    "slow_body",
    "header_too_large",
    "models_busy",
)
PAIR_STATES = ("loaded", "loading", "unloaded")
GPU_MEMORY_KINDS = ("used", "total")  # the order of gpu_memory.device_memory's pair
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 65536)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class PairQueue(NamedTuple):
    """One pair's queues at scrape time: texts waiting, rows decoding, and the texts one of its queues holds."""

    depth: int
    rows: int
    capacity: int


class _Queues(Collector):
    """``queue_depth``, ``active_sequences`` and ``queue_capacity`` by pair, from ``read()`` at scrape time: the
    pairs are whichever are served then."""

    def __init__(self, read: Callable[[], Mapping[str, PairQueue]]) -> None:
        self.read = read

    def describe(self) -> list[GaugeMetricFamily]:
        return self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        for pair, queue in self.read().items():
            for family, value in zip(families, queue, strict=True):
                family.add_metric([pair], value)
        yield from families

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        p = "attnserve_"
        return [
            GaugeMetricFamily(p + "queue_depth", "Texts waiting in the pair's queues.", labels=["pair"]),
            GaugeMetricFamily(p + "active_sequences", "Rows of the pair's texts being decoded.", labels=["pair"]),
            GaugeMetricFamily(
                p + "queue_capacity",
                "Texts one of the pair's queues holds (queue_size x decode_threads): /translate's, or /attention's.",
                labels=["pair"],
            ),
        ]


def _count(states: Callable[[], Mapping[str, int]], state: str) -> float:
    return states()[state]


def _nth(read: Callable[[], tuple[int, int]], index: int) -> float:
    try:
        return read()[index]
    except Exception:  # a scrape answers whatever the device says: the series reads NaN, never a 500
        return math.nan


class Metrics:
    """The service's metrics on their own registry (so that tests and several apps do not collide)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)
        p = "attnserve_"
        self.requests = Counter(
            p + "requests_total", "HTTP requests by endpoint and status.", ["endpoint", "status"], registry=r
        )
        self.request_duration = Histogram(
            p + "request_duration_seconds",
            "HTTP request latency, by endpoint and the request's pair.",
            ["endpoint", "pair"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            p + "queue_wait_seconds", "Time a text waited in the queue.", ["pair"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_size = Histogram(
            p + "batch_size",
            "The pair's rows (hypotheses) per decoding step.",
            ["pair"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            p + "batch_tokens", "Padded source tokens held by the batch per step.", buckets=TOKEN_BUCKETS, registry=r
        )
        self.inference = Histogram(
            p + "inference_seconds", "ONNX Runtime time per call.", ["stage"], buckets=STEP_BUCKETS, registry=r
        )
        self.input_tokens = Counter(p + "input_tokens_total", "Source tokens accepted.", registry=r)
        self.generated_tokens = Counter(
            p + "generated_tokens_total",
            "Tokens generated by the decoder (every beam hypothesis).",
            ["pair"],
            registry=r,
        )
        self.cache_hits = Counter(p + "cache_hits_total", "/translate texts answered from the cache.", registry=r)
        self.cache_misses = Counter(
            p + "cache_misses_total", "/translate texts the cache did not hold (cache on).", registry=r
        )
        self.span_segments = Counter(
            p + "span_segments_total",
            "/translate sentences with protected spans, by the path that restored them.",
            ["path"],
            registry=r,
        )
        self.rejected = Counter(
            p + "rejected_total", "Requests refused, by reason and pair.", ["reason", "pair"], registry=r
        )
        self.model_info = Gauge(
            p + "model_info",
            "Loaded bundles (value 1), with the graph variant /translate serves.",
            ["name", "source_lang", "target_lang", "provider", "variant"],
            registry=r,
        )
        self.pairs = Gauge(
            p + "pairs", "Language pairs bundles serve (pivot pairs not counted), by state.", ["state"], registry=r
        )
        self.model_load = Histogram(
            p + "model_load_seconds",
            "Time to load the pair's bundle (sessions, schedulers, warm-up).",
            ["pair"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.model_loads = Counter(p + "model_loads_total", "Loads of the pair's bundle.", ["pair"], registry=r)
        self.model_unloads = Counter(
            p + "model_unloads_total",
            "Unloads of the pair's bundle to make room under models_memory_mb.",
            ["pair"],
            registry=r,
        )
        self.gpu_memory = Gauge(
            p + "gpu_memory_bytes",
            "CUDA device memory while a bundle runs on CUDA: used (every process on the device: ONNX Runtime's "
            "arenas, which never shrink, and the CUDA context) and total.",
            ["kind"],
            registry=r,
        )
        self.packages = Gauge(
            p + "argos_packages",
            "Argos packages in ATTNSERVE_ARGOS_PACKAGES at start-up or the last reload: served, or skipped (the log "
            "names each).",
            ["state"],
            registry=r,
        )
        self.reloads = Counter(
            p + "reloads_total",
            "Reloads of the bundle directories and the packages (SIGHUP, or a change seen), by result: done, failed.",
            ["result"],
            registry=r,
        )
        self.bundles_skipped = Gauge(
            p + "bundles_skipped",
            "Bundles of ATTNSERVE_BUNDLES the last reload could not serve (broken, two of one pair, a failed load); "
            "the log names each.",
            registry=r,
        )
        for result in ("done", "failed"):  # both series from the start: a dashboard shows 0, not "no data"
            self.reloads.labels(result)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason, "")
        for stage in ("encode", "decode"):
            self.inference.labels(stage)
        for path in PATHS:
            self.span_segments.labels(path)

    def observe_request(self, endpoint: str, status: int, seconds: float, pair: str = "") -> None:
        endpoint = endpoint if endpoint in ENDPOINTS else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.request_duration.labels(endpoint, pair).observe(seconds)

    def track_queues(self, read: Callable[[], Mapping[str, PairQueue]]) -> None:
        """Read each served pair's queues from the schedulers at scrape time (once, when the pairs are
        registered)."""
        self.registry.register(_Queues(read))

    def track_pairs(self, states: Callable[[], Mapping[str, int]]) -> None:
        """Read the pairs by state (``loaded``, ``loading``, ``unloaded``) at scrape time."""
        for state in PAIR_STATES:
            self.pairs.labels(state).set_function(partial(_count, states, state))

    def track_gpu_memory(self, read: Callable[[], tuple[int, int]]) -> None:
        """Read the CUDA device's (used, total) bytes at scrape time, from a bundle on CUDA on; NaN while ``read``
        fails."""
        for index, kind in enumerate(GPU_MEMORY_KINDS):
            self.gpu_memory.labels(kind).set_function(partial(_nth, read, index))

    def observe_packages(self, served: list[bool]) -> None:
        """Whether each package found at start-up (or by the last reload) is served."""
        self.packages.labels("served").set(sum(served))
        self.packages.labels("skipped").set(len(served) - sum(served))

    def observe_load(self, pairs: list[str], seconds: float) -> None:
        """One bundle, serving ``pairs``, loaded in ``seconds`` (their unloads count from 0 now)."""
        for pair in pairs:
            self.model_load.labels(pair).observe(seconds)
            self.model_loads.labels(pair).inc()
            self.model_unloads.labels(pair)

    def observe_unload(self, pairs: list[str]) -> None:
        """One bundle, serving ``pairs``, unloaded."""
        for pair in pairs:
            self.model_unloads.labels(pair).inc()

    def observe_step(self, s: StepStats) -> None:
        """Record one scheduler iteration (called on the decoding thread; prometheus_client is thread-safe)."""
        for pair, rows in s.pair_rows.items():
            self.batch_size.labels(pair).observe(rows)
            self.generated_tokens.labels(pair).inc(rows)  # one token a row and step
        self.batch_tokens.observe(s.batch_tokens)
        if s.admitted:
            self.inference.labels("encode").observe(s.encode_seconds)
        self.inference.labels("decode").observe(s.decode_seconds)
        for pair, waited in s.queue_waits:
            self.queue_wait.labels(pair).observe(waited)

    def observe_cache(self, hits: int, misses: int) -> None:
        """One request's texts found in the response cache and not."""
        if hits:
            self.cache_hits.inc(hits)
        if misses:
            self.cache_misses.inc(misses)

    def observe_spans(self, paths: list[str]) -> None:
        """The path that restored each of one request's sentences with spans (service/serving/restoring.py)."""
        for path in paths:
            self.span_segments.labels(path).inc()

    def reject(self, reason: str, pair: str = "") -> None:
        """One request refused for ``reason``; ``pair`` is empty when it was refused before its pair was known."""
        self.rejected.labels(reason, pair).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
