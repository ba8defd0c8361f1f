"""The pair registry (service/serving/pairs.py): lazy loads, one load for concurrent first requests, least recently
used unloads under the bound, never an unload of a bundle in use, 503 when nothing can be unloaded."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import pytest

from service.errors import ModelsBusy, PairUnavailable, UnknownPair
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.manifest import Manifest, sha256
from service.serving.catalog import disk_bytes, footprint, pairs_of
from service.serving.pairs import Hooks, PairRegistry
from tests.service.pair_bundles import pair_bundle

PAIRS = [("en", "ja"), ("ja", "en"), ("en", "de")]


class Loads:
    """A fake load and unload that record what they were asked, optionally held until released."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.unloaded: list[str] = []
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def load(self, bundle: Bundle) -> dict[tuple[str, str], str]:
        self.loaded.append(bundle.name)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("a graph ONNX Runtime refuses")
        return dict.fromkeys(pairs_of(bundle.manifest), bundle.name)

    async def unload(self, engines: Mapping[tuple[str, str], str]) -> None:
        self.unloaded.extend(engines.values())


@pytest.fixture(scope="module")
def bundles(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Bundle]:
    root = tmp_path_factory.mktemp("pairs")
    return [load_bundle(pair_bundle(tiny_bundle, root, s, t)) for s, t in PAIRS]


def loaded(bundle: Bundle) -> int:
    """What the server counts for a bundle (service/serving/models.py): its loaded weights, its own variant."""
    return footprint(bundle, None)


def registry(bundles: list[Bundle], loads: Loads, fit: int = 0, hooks: Hooks | None = None) -> PairRegistry[str]:
    """A registry whose bound holds ``fit`` bundles (0: no bound)."""
    return PairRegistry(bundles, loads.load, loads.unload, loaded, fit * loaded(bundles[0]), hooks)


async def use(r: PairRegistry[str], pair: tuple[str, str]) -> str:
    async with r.use(pair) as engine:
        return engine


def test_a_pair_loads_on_first_use_only(bundles: list[Bundle]) -> None:
    loads, seconds = Loads(), []
    r = registry(bundles, loads, hooks=Hooks(loaded=lambda pairs, s: seconds.append((pairs, s))))

    async def run() -> list[str]:
        assert r.pair_states() == {"loaded": 0, "loading": 0, "unloaded": 3}
        return [await use(r, ("ja", "en")), await use(r, ("ja", "en"))]

    assert asyncio.run(run()) == ["tiny-ja-en", "tiny-ja-en"]
    assert loads.loaded == ["tiny-ja-en"] and [pairs for pairs, _ in seconds] == [[("ja", "en")]]
    assert r.pair_states() == {"loaded": 1, "loading": 0, "unloaded": 2}
    assert r.pairs == PAIRS


def test_concurrent_first_requests_load_once(bundles: list[Bundle]) -> None:
    loads = Loads()
    r = registry(bundles, loads)

    async def run() -> list[str]:
        loads.gate = asyncio.Event()
        tasks = [asyncio.ensure_future(use(r, ("en", "de"))) for _ in range(5)]
        await asyncio.sleep(0.01)
        assert r.pair_states()["loading"] == 1
        loads.gate.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(run()) == ["tiny-en-de"] * 5
    assert loads.loaded == ["tiny-en-de"]


def test_the_least_recently_used_idle_bundle_is_unloaded_under_the_bound(bundles: list[Bundle]) -> None:
    loads, unloads = Loads(), []
    r = registry(bundles, loads, fit=2, hooks=Hooks(unloaded=unloads.append))

    async def run() -> None:
        await use(r, ("en", "ja"))
        await use(r, ("ja", "en"))
        await use(r, ("en", "ja"))  # ja→en is now the least recently used
        await use(r, ("en", "de"))
        await asyncio.sleep(0)  # the unload's task

    asyncio.run(run())
    assert loads.unloaded == ["tiny-ja-en"] and unloads == [[("ja", "en")]]
    assert [b.name for b in r.loaded()] == ["tiny-en-ja", "tiny-en-de"]


def test_the_bound_counts_loaded_weights_not_files(tiny_bundle: Path, tmp_path: Path) -> None:
    """Bundles whose files take many times their loaded weights (a large file beside the graphs) fit two at a time
    in a bound of twice their loaded weights: loading the third unloads the least recently used."""
    heavy = []
    for s, t in PAIRS:
        path = pair_bundle(tiny_bundle, tmp_path, s, t)
        manifest = Manifest.read(path)
        (path / "unused.bin").write_bytes(bytes(4 * loaded(load_bundle(path))))
        manifest.sha256["unused.bin"] = sha256(path / "unused.bin")
        manifest.write(path)
        heavy.append(load_bundle(path))
    assert all(disk_bytes(b.path, b.manifest) > 4 * loaded(b) for b in heavy)
    loads = Loads()
    r = registry(heavy, loads, fit=2)

    async def run() -> None:
        for pair in PAIRS:
            await use(r, pair)
        await asyncio.sleep(0)

    asyncio.run(run())
    assert loads.loaded == ["tiny-en-ja", "tiny-ja-en", "tiny-en-de"] and loads.unloaded == ["tiny-en-ja"]
    assert [slot.footprint for slot in r.slots] == [loaded(b) for b in heavy]


def test_a_bundle_in_use_is_never_unloaded_and_a_full_registry_answers_busy(bundles: list[Bundle]) -> None:
    loads = Loads()
    r = registry(bundles, loads, fit=1)

    async def run() -> None:
        async with r.use(("en", "ja")):
            with pytest.raises(ModelsBusy, match="en→de is not loaded"):
                await use(r, ("en", "de"))
        assert await use(r, ("en", "de")) == "tiny-en-de"  # idle now: en→ja makes room

    asyncio.run(run())
    assert loads.unloaded == ["tiny-en-ja"]
    assert r.pair_states() == {"loaded": 1, "loading": 0, "unloaded": 2}


def test_a_failed_load_answers_unavailable_and_the_next_request_tries_again(bundles: list[Bundle]) -> None:
    loads = Loads()
    r = registry(bundles, loads)

    async def run() -> str:
        loads.fail = True
        with pytest.raises(PairUnavailable, match="en→ja failed to load"):
            await use(r, ("en", "ja"))
        assert r.pair_states()["unloaded"] == 3
        loads.fail = False
        return await use(r, ("en", "ja"))

    assert asyncio.run(run()) == "tiny-en-ja"
    assert loads.loaded == ["tiny-en-ja", "tiny-en-ja"]


def test_preload_loads_in_order_what_fits_and_an_unknown_pair_is_named(bundles: list[Bundle]) -> None:
    loads = Loads()
    r = registry(bundles, loads, fit=2)

    async def run() -> None:
        await r.preload(bundles)
        with pytest.raises(UnknownPair, match="ja→de; this server serves en→ja, ja→en, en→de"):
            await use(r, ("ja", "de"))
        await r.close()

    asyncio.run(run())
    assert loads.loaded == ["tiny-en-ja", "tiny-ja-en"]
    assert sorted(loads.unloaded) == ["tiny-en-ja", "tiny-ja-en"]


def test_the_pairs_of_a_multi_target_bundle_share_one_load(tiny_bundle: Path, tmp_path: Path) -> None:
    bundle = pair_bundle(tiny_bundle, tmp_path, "en", "ja")
    manifest = Manifest.read(bundle)
    manifest.data["targets"] = [{"code": "ja", "prefix": [5]}, {"code": "ko", "prefix": [6]}]
    manifest.write(bundle)
    loads = Loads()
    r = registry([load_bundle(bundle)], loads)

    async def run() -> list[str]:
        return [await use(r, ("en", "ja")), await use(r, ("en", "ko"))]

    assert asyncio.run(run()) == ["tiny-en-ja", "tiny-en-ja"]
    assert loads.loaded == ["tiny-en-ja"]
    assert r.pairs == [("en", "ja"), ("en", "ko")]
    assert r.pair_states() == {"loaded": 2, "loading": 0, "unloaded": 0}


def test_a_bundle_no_longer_served_leaves_its_pairs_at_once_and_unloads_after_its_requests(
    bundles: list[Bundle], tiny_bundle: Path, tmp_path: Path
) -> None:
    loads = Loads()
    en_ja, ja_en, en_de = bundles
    r = registry([en_ja, ja_en], loads)
    en_fr = load_bundle(pair_bundle(tiny_bundle, tmp_path, "en", "fr"))

    async def run() -> None:
        async with r.use(("ja", "en")) as held:  # a request in flight on ja→en
            r.stage([en_fr, en_de])
            await r.preload([en_fr])  # warmed before it is served
            assert ("en", "fr") not in r.pairs and loads.loaded == ["tiny-ja-en", "tiny-en-fr"]
            r.serve([en_ja, en_fr])  # ja→en gone, en→fr in; en→de staged but not served: dropped
            assert r.pairs == [("en", "ja"), ("en", "fr")]
            with pytest.raises(UnknownPair, match="serves en→ja, en→fr"):
                await use(r, ("ja", "en"))
            await asyncio.sleep(0)
            assert loads.unloaded == [] and held == "tiny-ja-en"  # still held: not unloaded
        await asyncio.sleep(0)
        assert loads.unloaded == ["tiny-ja-en"]  # its request ended
        assert await use(r, ("en", "fr")) == "tiny-en-fr"

    asyncio.run(run())
    assert [s.bundle.name for s in r.slots] == ["tiny-en-ja", "tiny-en-fr"]
    assert r.pair_states() == {"loaded": 1, "loading": 0, "unloaded": 1}


def test_a_staged_bundle_whose_load_fails_is_dropped(bundles: list[Bundle]) -> None:
    loads = Loads()
    en_ja, ja_en, _ = bundles
    r = registry([en_ja], loads)

    async def run() -> None:
        r.stage([ja_en])
        loads.fail = True
        with pytest.raises(PairUnavailable):
            await r.preload([ja_en])
        r.drop(ja_en)

    asyncio.run(run())
    assert [s.bundle.name for s in r.slots] == ["tiny-en-ja"] and r.pairs == [("en", "ja")]
