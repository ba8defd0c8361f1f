"""The served models (service/serving/models.py) reloaded while serving: a directory of bundles gains, loses and
holds a broken member, and the packages directory gains a package, under load; requests to the other pairs never
fail, and SIGHUP reloads a real process."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from service.runtime.manifest import Manifest
from service.settings import Settings
from tests.service.conftest import Server
from tests.service.pair_bundles import pair_bundle
from tests.service.process import ServeProcess


class Load:
    """Clients translating into ``pair`` without pause, on threads, until stopped; their answers' status codes."""

    def __init__(self, url: str, pair: tuple[str, str], clients: int = 2) -> None:
        self.url, self.pair = url, pair
        self.statuses: Counter[int] = Counter()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]

    def run(self) -> None:
        body = {"q": ["Open the file", "Settings"], "source": self.pair[0], "target": self.pair[1]}
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stopping.is_set():
                self.statuses[client.post("/translate", json=body).status_code] += 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=60)


def until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the reload was not seen in time"
        time.sleep(0.05)


def targets(url: str, source: str = "en") -> list[str]:
    languages = httpx.get(url + "/languages", timeout=10).json()
    return next((entry["targets"] for entry in languages if entry["code"] == source), [])


def metric(url: str, name: str) -> float:
    found = re.search(rf"^attnserve_{name} (\S+)$", httpx.get(url + "/metrics", timeout=10).text, re.M)
    assert found, name
    return float(found.group(1))


def moved_in(tiny: Path, root: Path, source: str, target: str, staging: Path) -> Path:
    """A bundle of ``source``→``target`` built beside ``root`` and renamed into it (at once, whole)."""
    return pair_bundle(tiny, staging, source, target).rename(root / f"tiny-{source}-{target}")


@pytest.fixture
def bundles(tiny_bundle: Path, tmp_path: Path) -> Path:
    """A directory of bundles: en→ja and en→de."""
    root = tmp_path / "bundles"
    for target in ("ja", "de"):
        pair_bundle(tiny_bundle, root, "en", target)
    return root


def test_a_directory_of_bundles_gains_loses_and_skips_members_under_load(
    bundles: Path, tiny_bundle: Path, tmp_path: Path
) -> None:
    settings = Settings(bundles=[bundles], reload_interval_s=0.1, max_wait_ms=1, argos_packages="")
    with Server(settings) as server, Load(server.url, ("en", "ja")) as other, Load(server.url, ("en", "de")) as gone:
        moved_in(tiny_bundle, bundles, "en", "fr", tmp_path / "staging")
        until(lambda: "fr" in targets(server.url))
        response = server.client().post("/translate", json={"q": "Open the file", "source": "en", "target": "fr"})
        assert response.status_code == 200, response.text

        shutil.rmtree(bundles / "tiny-en-de")  # its engine stays in memory until its requests end
        until(lambda: "de" not in targets(server.url))
        time.sleep(0.3)  # en→de's clients now hear of an unknown pair

        broken = shutil.copytree(bundles / "tiny-en-fr", tmp_path / "broken")
        (broken / "spm.model").unlink()
        broken.rename(bundles / "tiny-en-es")
        until(lambda: metric(server.url, "bundles_skipped") == 1)
        assert targets(server.url) == ["fr", "ja"]
        time.sleep(0.3)
        assert metric(server.url, 'reloads_total{result="done"}') >= 3
        ready = httpx.get(server.url + "/readyz", timeout=10).json()
    assert other.statuses[200] > 10 and set(other.statuses) == {200}, other.statuses  # never disturbed
    assert gone.statuses[200] > 0 and set(gone.statuses) == {200, 400}, gone.statuses  # answered, then unknown
    assert ready["models"] == ["tiny-en-ja", "tiny-en-fr"]


def test_sighup_reloads_a_real_process(bundles: Path, tiny_bundle: Path, tmp_path: Path) -> None:
    server = ServeProcess(tmp_path / "serve.log", bundles=bundles, reload_interval_s=0, argos_packages="")
    with server.wait_ready():
        moved_in(tiny_bundle, bundles, "en", "fr", tmp_path / "staging")
        time.sleep(0.5)
        assert "fr" not in targets(server.url)  # no polling: nothing seen yet
        os.kill(server.process.pid, signal.SIGHUP)
        until(lambda: "fr" in targets(server.url))
        response = httpx.post(server.url + "/translate", json={"q": "Settings", "source": "en", "target": "fr"})
        assert response.status_code == 200, response.text
    assert "reloaded: serving 3 pairs; 1 bundles added, 0 gone" in server.text()


def test_a_bundle_replaced_in_place_is_read_again(bundles: Path) -> None:
    settings = Settings(bundles=[bundles], reload_interval_s=0.1, max_wait_ms=1, argos_packages="")
    with Server(settings) as server:
        manifest = Manifest.read(bundles / "tiny-en-de")
        manifest.target_lang = "it"
        manifest.write(bundles / "tiny-en-de")
        until(lambda: targets(server.url) == ["it", "ja"])
        response = server.client().post("/translate", json={"q": "Settings", "source": "en", "target": "it"})
        assert response.status_code == 200, response.text


@pytest.fixture
def packages_server(argos_installation: tuple[Path, Path], tiny_bundle: Path, tmp_path: Path) -> Iterator[Server]:
    """A server of the shipped-like en→ja bundle and an empty packages directory, the importer available."""
    packages = tmp_path / "packages"
    packages.mkdir()
    shipped = tmp_path / "shipped"
    en_ja = pair_bundle(tiny_bundle, shipped, "en", "ja")
    settings = Settings(
        bundles=[shipped],
        shipped_bundles=shipped,
        argos_packages=packages,
        argos_cache=tmp_path / "cache",
        reload_interval_s=0.1,
        max_wait_ms=1,
    )
    assert en_ja.is_dir()
    with Server(settings) as server:
        yield server


def test_a_package_added_is_imported_and_takes_over_the_shipped_bundles_pair_under_load(
    packages_server: Server, argos_installation: tuple[Path, Path]
) -> None:
    from service.serving.packages import importer_here

    if not importer_here():
        pytest.skip("the package importer is not installed here")
    installed, _ = argos_installation
    packages = packages_server.app.state.attnserve.settings.argos_packages
    name = "translate-en_ja-1_0"
    with Load(packages_server.url, ("en", "ja")) as load:
        shutil.copytree(installed / name, packages / f".{name}")  # hidden: not a package until renamed
        (packages / f".{name}").rename(packages / name)
        until(lambda: httpx.get(packages_server.url + "/readyz", timeout=10).json()["models"] == [name], 600)
        time.sleep(0.5)
    assert metric(packages_server.url, 'argos_packages{state="served"}') == 1
    assert load.statuses[200] > 10 and set(load.statuses) == {200}, load.statuses  # the shipped bundle's, then the
    # package's: no request of the pair lost in the swap
