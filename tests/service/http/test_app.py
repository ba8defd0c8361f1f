"""The app's start-up (service/http/app.py's lifespan)."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from service.runtime.bundle import sha256
from service.runtime.manifest import Manifest
from service.serving.budget import MiB
from service.serving.catalog import loaded_bytes
from service.settings import Settings
from tests.service.conftest import Server, ServerFactory
from tests.service.pair_bundles import pair_bundle


def test_start_up_leaves_what_it_made_out_of_garbage_collection(make_server: ServerFactory) -> None:
    """Once ready, what start-up made is frozen (the cyclic collector skips it) and the young generation is
    collected every 10,000 allocations: less of the event loop's time in the collector."""
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    make_server()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (10_000, 10, 10)


def metric(text: str, name: str) -> float:
    """One sample's value from /metrics' text."""
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return float(line.split()[-1])


def padded(bundle: Path, size: int) -> Path:
    """``bundle`` with an unused initializer in its fast decoder that brings its loaded weights to ``size`` bytes:
    its footprint under models_memory_mb, whatever the tiny bundle's own size."""
    manifest = Manifest.read(bundle)
    graph = bundle / "decoder.fast.onnx"
    model = onnx.load(str(graph), load_external_data=False)
    pad = np.zeros((size - loaded_bytes(bundle, manifest, "float32")) // 4, np.float32)
    model.graph.initializer.append(numpy_helper.from_array(pad, "padding"))
    onnx.save(model, str(graph))
    manifest.sha256[graph.name] = sha256(graph)
    manifest.write(bundle)
    assert loaded_bytes(bundle, manifest, "float32") == size
    return bundle


def test_pairs_load_on_first_use_and_the_least_recently_used_unloads_under_the_bound(
    tiny_bundle: Path, tmp_path: Path
) -> None:
    """Three bundles, none eager, a bound that holds two: ready at once, every pair listed; each first request loads
    its bundle, the third unloads the least recently used, which loads again and answers as before."""
    pairs = (("en", "ja"), ("ja", "en"), ("en", "de"))
    bundles = [padded(pair_bundle(tiny_bundle, tmp_path, s, t), 900 << 10) for s, t in pairs]
    with Server(Settings(bundles=bundles, eager_models=0, models_memory_mb=2)) as server, server.client() as c:
        ready = c.get("/readyz").json()
        assert ready == {"status": "ready", "models": ["tiny-en-ja", "tiny-ja-en", "tiny-en-de"], "loaded": []}
        assert [x["code"] for x in c.get("/languages").json()] == ["de", "en", "ja"]
        assert metric(c.get("/metrics").text, 'attnserve_pairs{state="unloaded"}') == 3

        def ask(source: str, target: str) -> str:
            response = c.post("/translate", json={"q": "Open file", "source": source, "target": target})
            assert response.status_code == 200, response.text
            return str(response.json()["translatedText"])

        first = ask("en", "ja")
        ask("ja", "en")
        ask("en", "de")  # en→ja, the least recently used, makes room
        assert c.get("/readyz").json()["loaded"] == ["tiny-ja-en", "tiny-en-de"]
        assert ask("en", "ja") == first  # ja→en makes room now
        text = c.get("/metrics").text
    assert metric(text, 'attnserve_pairs{state="loaded"}') == 2
    assert metric(text, 'attnserve_pairs{state="unloaded"}') == 1
    assert metric(text, 'attnserve_model_loads_total{pair="en-ja"}') == 2
    assert metric(text, 'attnserve_model_loads_total{pair="ja-en"}') == 1
    assert metric(text, 'attnserve_model_unloads_total{pair="en-ja"}') == 1
    assert metric(text, 'attnserve_model_unloads_total{pair="ja-en"}') == 1
    assert metric(text, 'attnserve_model_load_seconds_count{pair="en-de"}') == 1
    assert 'attnserve_model_info{name="tiny-ja-en"' not in text and 'attnserve_model_info{name="tiny-en-ja"' in text


def test_by_default_every_bundle_is_loaded_before_ready(make_server: ServerFactory) -> None:
    with make_server().client() as c:
        assert c.get("/readyz").json() == {"status": "ready", "models": ["tiny-en-ja"], "loaded": ["tiny-en-ja"]}
        assert metric(c.get("/metrics").text, 'attnserve_pairs{state="loaded"}') == 1


def test_every_bundle_shares_the_process_memory_budget_and_cache(tiny_bundle: Path, tmp_path: Path) -> None:
    bundles = [tiny_bundle, pair_bundle(tiny_bundle, tmp_path, "en", "de")]
    with Server(Settings(bundles=bundles, memory_budget_mb=64, cache_mb=2)) as server:
        registry = server.app.state.attnserve.models.registry
        assert registry is not None
        ja, de = registry.engines()
        assert ja.budget is de.budget and ja.budget.capacity == 64 * MiB
        assert ja.cache is de.cache and ja.cache is not None and ja.cache.capacity == 2 * MiB
