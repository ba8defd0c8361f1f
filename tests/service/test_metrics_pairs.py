"""A server of several pairs under load: /metrics has each pair's series, under the pair's own label."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from service.runtime.manifest import Manifest
from service.settings import Settings
from tests.service.conftest import Server
from tests.service.pair_bundles import pair_bundle

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]
LABEL = re.compile(r'(\w+)="([^"]*)"')


def parse(text: str) -> Series:
    """Each attnserve_ sample of a scrape by (name, labels)."""
    out: Series = {}
    for line in text.splitlines():
        if line.startswith("attnserve_"):
            name_labels, value = line.rsplit(" ", 1)
            name, _, labels = name_labels.partition("{")
            out[(name, frozenset(LABEL.findall(labels)))] = float(value)
    return out


def value(series: Series, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there are none)."""
    return sum(v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls)


def multi_target(tiny: Path, root: Path) -> Path:
    """The tiny bundle as one model of en→de and en→fr (each target opened by its own source token)."""
    out = pair_bundle(tiny, root, "en", "de").rename(root / "tiny-en-de-fr")
    manifest = Manifest.read(out)
    manifest.name = out.name
    manifest.data["targets"] = [{"code": "de", "prefix": [5]}, {"code": "fr", "prefix": [6]}]
    manifest.write(out)
    return out


def test_each_pair_has_its_own_series_under_load(tiny_bundle: Path, tmp_path: Path) -> None:
    bundles = [tiny_bundle, multi_target(tiny_bundle, tmp_path), pair_bundle(tiny_bundle, tmp_path, "de", "en")]
    # en→de and en→fr share one queue of 16 texts: their 24 overflow it; de→en and en→ja take 12 each.
    settings = Settings(bundles=bundles, api_keys=["k"], max_batch_size=2, queue_size=16, max_wait_ms=5)
    served = ["en-ja", "en-de", "en-fr", "de-en"]  # the pairs bundles serve; de→ja goes through en
    sent = {"en-de": ("en", "de"), "en-fr": ("en", "fr"), "de-ja": ("de", "ja")}

    async def load(url: str) -> tuple[list[httpx.Response], list[Series]]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            load = [
                asyncio.ensure_future(c.post("/translate", json={"q": f"Text {i}", "source": s, "target": t,
                                                                 "api_key": "k", "max_length": 30}))
                for s, t in sent.values()
                for i in range(12)
            ]  # fmt: skip
            during = []
            while not all(f.done() for f in load):
                during.append(parse((await c.get("/metrics")).text))
                await asyncio.sleep(0.01)
            return list(await asyncio.gather(*load)), during

    with Server(settings) as server:
        responses, during = asyncio.run(load(server.url))
        with server.client() as c:
            assert c.post("/translate", json={"q": "a", "source": "en", "target": "de"}).status_code == 403
            after = parse(c.get("/metrics").text)

    status = {pair: [r.status_code for r in responses[12 * i : 12 * i + 12]] for i, pair in enumerate(sent)}
    assert status["de-ja"] == [200] * 12 and set(status["en-de"] + status["en-fr"]) == {200, 503}
    for pair in sent:  # each request under its own pair: a pivot's under its pair, not its hops'
        assert value(after, "attnserve_request_duration_seconds_count", endpoint="translate", pair=pair) == 12
        assert value(after, "attnserve_rejected_total", reason="queue_full", pair=pair) == status[pair].count(503)
    for pair in served:  # the schedulers' series under the pair each text was queued for
        assert value(after, "attnserve_queue_capacity", pair=pair) == 16
        assert value(after, "attnserve_model_loads_total", pair=pair) == 1
        assert value(after, "attnserve_batch_size_count", pair=pair) > 0, pair
        assert value(after, "attnserve_generated_tokens_total", pair=pair) > 0, pair
        for gauge in ("attnserve_queue_depth", "attnserve_active_sequences"):  # every pair's, in every scrape
            assert all((gauge, frozenset({("pair", pair)})) in d for d in during), (gauge, pair)
    assert value(after, "attnserve_queue_wait_seconds_count", pair="en-de") == status["en-de"].count(200)
    for hop in ("de-en", "en-ja"):  # a pivot's two hops, each under its own pair
        assert value(after, "attnserve_queue_wait_seconds_count", pair=hop) == 12
    assert not [key for key in after if ("pair", "de-ja") in key[1] and "queue" in key[0]]  # the hops queue
    assert any(value(d, "attnserve_queue_depth", pair="en-fr") for d in during)  # the shared queue, split
    assert any(value(d, "attnserve_queue_depth", pair="en-de") for d in during)
    assert {dict(labels).get("pair") for _, labels in after} == {None, "", *served, "de-ja"}  # the pairs served
    assert value(after, "attnserve_rejected_total", reason="queue_full", pair="") == 0
    assert value(after, "attnserve_rejected_total", reason="auth", pair="") == 1  # refused before its pair was known
