"""bench/peers.py on a tiny random bundle: the same weights give the same greedy tokens in every engine.

CTranslate2 comes with the ``dev`` extra; outside CI the test skips without it.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import engines
import load
import offline
import pytest
import report

from service.runtime.bundle import load_bundle
from tests.bench.peer_engines import need_ctranslate2
from tests.bundles import SENTENCES

need_ctranslate2()

MAX_LENGTH = 20


@pytest.fixture(scope="module")
def prepared(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> engines.Prepared:
    return engines.prepare(tiny_bundle, tmp_path_factory.mktemp("peers"))


@pytest.fixture(scope="module")
def sources(tiny_bundle: Path) -> list[list[int]]:
    tokenizer = load_bundle(tiny_bundle).tokenizer
    return [tokenizer.encode_source(t) for t in SENTENCES[:4]]  # different lengths: one padded batch


def test_same_weights_same_greedy_tokens(prepared: engines.Prepared, sources: list[list[int]]) -> None:
    ours = engines.translate(engines.AttnserveEngine(prepared.bundle), sources, 1, MAX_LENGTH)
    ct2 = engines.translate(engines.CTranslate2Engine(prepared.ct2, prepared.vocab), sources, 1, MAX_LENGTH)
    hf = engines.translate(engines.TransformersEngine(prepared.hf), sources, 1, MAX_LENGTH)
    assert len({tuple(t) for t in ours}) > 1, "the random model's outputs should depend on the input"
    assert all(0 < len(t) <= MAX_LENGTH for t in ours)
    assert ct2 == ours
    assert hf == ours
    # Beam 4 too: the same search as CTranslate2's.
    ct2_engine = engines.CTranslate2Engine(prepared.ct2, prepared.vocab)
    beam = engines.translate(engines.AttnserveEngine(prepared.bundle), sources, 4, MAX_LENGTH)
    assert beam == engines.translate(ct2_engine, sources, 4, MAX_LENGTH)
    # Batches of 2 (sorted by length, then put back in order) change nothing.
    assert engines.translate(engines.AttnserveEngine(prepared.bundle), sources, 1, MAX_LENGTH, batch_size=2) == ours


def test_int8_and_beam_run(prepared: engines.Prepared, sources: list[list[int]]) -> None:
    assert "int8" in load_bundle(prepared.bundle).variants
    for engine in (
        engines.AttnserveEngine(prepared.bundle, "int8"),
        engines.CTranslate2Engine(prepared.ct2, prepared.vocab, "int8"),
    ):
        for beam in (1, 4):
            out = engines.translate(engine, sources, beam, MAX_LENGTH)
            assert len(out) == len(sources) and all(len(t) <= MAX_LENGTH for t in out)


def test_engine_subprocess_reports_tokens_and_memory(prepared: engines.Prepared, sources: list[list[int]]) -> None:
    work = prepared.hf.parent
    setup = {"bundle": str(prepared.bundle), "hf": str(prepared.hf), "ct2": str(prepared.ct2)}
    (work / "setup.json").write_text(json.dumps({**setup, "sources": sources, "max_length": MAX_LENGTH}))
    out = offline.run_job(offline.Job("attnserve", "float32", 1, 1), work, timeout=120)
    assert out["tokens"] == engines.translate(engines.AttnserveEngine(prepared.bundle), sources, 1, MAX_LENGTH)
    assert out["seconds"] > 0 and out["peak_rss_mb"] > 10


def test_length_batches_sort_and_chunk() -> None:
    assert engines.length_batches([5, 1, 3, 1], 2) == [[1, 3], [2, 0]]


def test_load_statistics() -> None:
    assert load.percentile([0.1, 0.2, 0.3, math.inf], 50) == 0.2
    assert load.percentile([0.1, 0.2, 0.3, math.inf], 99) == math.inf
    outcomes = [load.Outcome("all", 0.1 * i, True) for i in range(1, 11)]
    point = load.summarize(outcomes, offered=5, elapsed=2.0)
    assert (point.achieved, point.p50, point.errors) == (5.0, 0.5, 0)
    assert point.sustained
    failed = load.summarize([*outcomes, load.Outcome("all", 0.0, False)], offered=5, elapsed=2.0)
    assert not failed.sustained and failed.p99 == math.inf
    assert load.best_sustained([failed, point]) is point


def test_refine_rate_bisects_between_the_best_sustained_rate_and_the_next() -> None:
    def point(offered: float, p99: float) -> load.LoadPoint:
        return load.LoadPoint(offered, offered, 0.1, 0.2, p99, 0, 100)

    points = [point(416, 0.3), point(448, 0.5), point(480, 2.0)]
    assert load.refine_rate(points) == 464
    assert load.refine_rate([*points, point(464, 0.9)]) == 472  # held: look higher
    assert load.refine_rate([*points, point(464, 1.5)]) == 456  # broke: look lower
    assert load.refine_rate([point(8, 2.0)]) is None  # nothing held
    assert load.refine_rate(points[:2]) is None  # nothing above was tried


def test_http_ratios_name_ctranslate2_at_the_same_and_at_its_fastest_thread_count() -> None:
    def ct2(threads: int, seconds: float) -> offline.JobResult:
        return offline.JobResult(offline.Job("ctranslate2", "float32", 1, threads), [seconds])

    def curve(achieved: float) -> tuple[list[load.LoadPoint], None]:
        return [load.LoadPoint(achieved, achieved, 0.1, 0.2, 0.3, 0, 100)], None

    curves = {("attnserve", 1): curve(300), ("attnserve", 2): curve(400), ("FastAPI + transformers", 1): curve(30)}
    text = report.http_ratios(curves, [ct2(1, 2.0), ct2(2, 5.0)], n=1000)  # 500/s and 200/s
    assert "- attnserve, 1 thread(s): 0.60× CTranslate2 float32 offline; 10.0× FastAPI + transformers" in text
    assert (
        "- attnserve, 2 thread(s): 2.00× CTranslate2 float32 offline; 0.80× its fastest in the offline table (1 "
        "thread(s));" in text
    )
    # CTranslate2 run just before and after a sweep anchors its ratio instead of the offline table
    text = report.http_ratios(curves, [ct2(1, 2.0), ct2(2, 5.0)], n=1000, anchors={("attnserve", 1): (250, 350)})
    assert (
        "- attnserve, 1 thread(s): 1.00× CTranslate2 float32 offline, run just before and after the sweep (250.0 "
        "and 350.0 sentences/s); 10.0× FastAPI + transformers" in text
    )


def test_poisson_plan_is_deterministic_and_near_its_rate() -> None:
    plan = load.poisson_plan(50, 10, lambda rng: ("all", {"q": "x"}), seed=3)
    assert plan == load.poisson_plan(50, 10, lambda rng: ("all", {"q": "x"}), seed=3)
    assert 400 < len(plan) < 600
    assert all(0 <= a.at < 10 for a in plan)


def test_open_loop_plan_against_the_server(tiny_bundle: Path) -> None:
    from common import attnserve_server

    bundle = load_bundle(tiny_bundle)
    pair = {"source": bundle.source_lang, "target": bundle.target_lang, "max_length": 4}
    plan = load.poisson_plan(40, 0.5, lambda rng: ("all", {"q": rng.choice(SENTENCES), **pair}), seed=1)
    plan.append(load.Arrival(0.1, "all", {"q": "x", **pair, "target": "xx"}))  # no such pair: 400, a failure
    with attnserve_server(tiny_bundle, {}) as server:
        outcomes, elapsed = asyncio.run(load.run_plan(server.url, plan, timeout=30))
    assert len(outcomes) == len(plan) and elapsed >= max(a.at for a in plan)
    assert sum(not o.ok for o in outcomes) == 1
    assert all(0 <= o.latency < 30 for o in outcomes)
