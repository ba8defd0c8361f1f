"""Argos packages served from a cache (service/serving/packages.py): argos-translate's packages directory, content
keys, one import a package's content, refusals kept apart; and ``attnserve serve`` with ATTNSERVE_ARGOS_PACKAGES on
real packages: it imports what the cache lacks, reuses it on the next start, imports a changed package again, and
skips a broken one in one log line and the metric while the others serve."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest

from service.runtime.manifest import MANIFEST, Manifest
from service.serving import packages
from service.serving.packages import (
    ImportRefused,
    argos_packages_dir,
    content_key,
    default_cache_dir,
    sync,
)
from tests.service.argos_installation import BROKEN, PACKAGES
from tests.service.process import ServeProcess


def test_argos_packages_dir_is_argos_translates() -> None:
    home = Path.home()
    assert argos_packages_dir({}) == home / ".local/share/argos-translate/packages"
    assert argos_packages_dir({"XDG_DATA_HOME": "/data"}) == Path("/data/argos-translate/packages")
    assert argos_packages_dir({"XDG_DATA_HOME": "/d", "ARGOS_PACKAGES_DIR": "/p"}) == Path("/p")
    assert argos_packages_dir({"ARGOS_TRANSLATE_PACKAGES_DIR": "/legacy"}) == Path("/legacy")
    snap = {"SNAP": "/snap/x", "SNAP_USER_DATA": "/home/u/snap/x/1"}
    assert argos_packages_dir(snap) == Path("/home/u/snap/x/1/.local/share/argos-translate/packages")
    assert default_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/attnserve/argos")


def fake_package(root: Path, name: str, source: str = "en", target: str = "de", weights: bytes = b"w") -> Path:
    folder = root / name
    (folder / "model").mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"from_code": source, "to_code": target}))
    (folder / "model" / "model.bin").write_bytes(weights)
    return folder


def test_the_content_key_follows_names_and_bytes(tmp_path: Path) -> None:
    a = fake_package(tmp_path, "a")
    key = content_key(a)
    assert content_key(Path(shutil.copytree(a, tmp_path / "copy"))) == key
    (a / "model" / "model.bin").write_bytes(b"x")
    assert content_key(a) != key
    (a / "model" / "model.bin").write_bytes(b"w")
    assert content_key(a) == key
    (a / "model" / "model.bin").rename(a / "model" / "other.bin")
    assert content_key(a) != key


def test_a_bundle_format_of_its_own_imports_a_cached_package_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version of attnserve that writes another bundle format does not take the cache's bundles of the old one."""
    a = fake_package(tmp_path, "a")
    key = content_key(a)
    monkeypatch.setattr(packages, "FORMAT", "attnserve-bundle/0")
    assert content_key(a) != key


class Importer:
    """Writes a manifest and counts its calls; refuses the packages named in ``refuse``."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.calls: list[str] = []
        self.refuse = refuse

    def __call__(self, folder: Path, out: Path, name: str) -> None:
        self.calls.append(name)
        if name in self.refuse:
            raise ImportRefused("model.bin is truncated")
        out.mkdir()
        Manifest({"name": name}).write(out)


def test_each_content_is_imported_once(tmp_path: Path) -> None:
    packages, cache = tmp_path / "packages", tmp_path / "cache"
    fake_package(packages, "en_de")
    fake_package(packages, "de_en", "de", "en")
    (packages / "notes").mkdir()  # no metadata.json
    importer = Importer()
    first = sync(packages, cache, importer)
    assert [(o.folder.name, o.state) for o in first] == [
        ("de_en", "imported"),
        ("en_de", "imported"),
        ("notes", "unreadable"),
    ]
    assert first[1].pair == ("en", "de") and first[1].bundle is not None and first[1].bundle.parent == cache
    assert "no metadata.json" in first[2].reason
    again = sync(packages, cache, importer)
    assert [o.state for o in again] == ["cached", "cached", "unreadable"] and importer.calls == ["de_en", "en_de"]
    assert [o.bundle for o in again] == [o.bundle for o in first]
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "no partial import left behind"

    (packages / "en_de" / "model" / "model.bin").write_bytes(b"changed")
    changed = sync(packages, cache, importer)
    assert [o.state for o in changed] == ["cached", "imported", "unreadable"]
    assert changed[1].bundle != first[1].bundle and importer.calls[-1] == "en_de"


def test_a_refusal_is_kept_for_servers_that_cannot_import(tmp_path: Path) -> None:
    packages, cache = tmp_path / "packages", tmp_path / "cache"
    fake_package(packages, "broken")
    fake_package(packages, "fine", "de", "en")
    refused = sync(packages, cache, Importer(refuse=("broken",)))
    assert [(o.state, o.reason) for o in refused] == [("refused", "model.bin is truncated"), ("imported", "")]
    assert not list(cache.glob("broken-*/")), "a refused package leaves no bundle"
    fake_package(packages, "new", "en", "ja")
    without = sync(packages, cache, None)
    assert [(o.folder.name, o.state) for o in without] == [
        ("broken", "refused"),
        ("fine", "cached"),
        ("new", "not imported"),
    ]
    assert without[0].reason == "model.bin is truncated"
    assert "attnserve import-argos --packages" in without[2].reason and str(cache) in without[2].reason
    assert sync(packages, cache, Importer())[0].state == "imported"  # a later importer that takes it


def test_the_one_shot_import_names_each_package(argos_installation: tuple[Path, Path]) -> None:
    _, cache = argos_installation
    log = (cache.parent / "import.log").read_text()
    for name in PACKAGES:
        assert re.search(rf"argos package {name} \(\w+→\w+\): imported, {cache}/{name}-[0-9a-f]{{16}}\n", log)
    (skipped,) = [line for line in log.splitlines() if "WARNING" in line]
    assert f"argos package {BROKEN} (en→fr): skipped, refused: model.bin is truncated" in skipped
    assert sorted(p.name.rsplit("-", 1)[0] for p in cache.iterdir() if p.is_dir()) == sorted(PACKAGES)


def served_packages(server: ServeProcess) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    return {m[0]: float(m[1]) for m in re.findall(r'attnserve_argos_packages\{state="(\w+)"\} (\S+)', text)}


def start(packages: Path, cache: Path, log: Path) -> ServeProcess:
    return ServeProcess(log, argos_packages=packages, argos_cache=cache).wait_ready(timeout=300)


def test_serve_imports_what_the_cache_lacks_once(argos_installation: tuple[Path, Path], tmp_path: Path) -> None:
    installed, _ = argos_installation
    packages, cache, name = tmp_path / "packages", tmp_path / "cache", "translate-en_ja-1_0"
    for folder in (name, BROKEN):
        shutil.copytree(installed / folder, packages / folder)
    body = {"q": "Open file", "source": "en", "target": "ja"}

    with start(packages, cache, tmp_path / "first.log") as server:
        assert httpx.post(server.url + "/translate", json=body, timeout=60).status_code == 200
        assert served_packages(server) == {"served": 1.0, "skipped": 1.0}
        first = server.text()
    assert f"argos package {name}: importing" in first
    (warning,) = [line for line in first.splitlines() if "WARNING" in line]
    assert f"{packages / BROKEN} (en→fr): skipped, refused: model.bin is truncated" in warning
    (bundle,) = cache.glob(f"{name}-*/")
    written = (bundle / MANIFEST).stat().st_mtime_ns

    with start(packages, cache, tmp_path / "second.log") as server:
        assert httpx.post(server.url + "/translate", json=body, timeout=60).status_code == 200
        second = server.text()
    assert f"{name}: importing" not in second and f"{name} (en→ja): cached, {bundle}" in second
    assert (bundle / MANIFEST).stat().st_mtime_ns == written and list(cache.glob(f"{name}-*/")) == [bundle]

    meta = packages / name / "metadata.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"package_version": "1.1"}))
    with start(packages, cache, tmp_path / "third.log") as server:
        assert httpx.post(server.url + "/translate", json=body, timeout=60).status_code == 200
        third = server.text()
    (changed,) = set(cache.glob(f"{name}-*/")) - {bundle}
    assert f"{name}: importing" in third and f"{name} (en→ja): imported, {changed}" in third


def test_without_the_importer_the_cache_is_served_and_the_rest_named(
    argos_installation: tuple[Path, Path], tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.serving import startup
    from service.settings import Settings

    installed, cache = argos_installation
    packages = Path(shutil.copytree(installed, tmp_path / "packages"))
    fake_package(packages, "translate-de_fr-1_0", "de", "fr")  # not in the cache
    monkeypatch.setattr("service.serving.packages.importer_here", lambda: False)
    checked = startup.check(Settings(argos_packages=packages, argos_cache=cache))
    assert sorted(b.name for b in checked.bundles) == sorted(PACKAGES)
    states = {o.folder.name: o.state for o in checked.packages}
    assert states == {**dict.fromkeys(PACKAGES, "cached"), BROKEN: "refused", "translate-de_fr-1_0": "not imported"}
    beside = startup.check(Settings(bundles=[tiny_bundle], argos_packages=packages, argos_cache=cache))
    assert beside.bundles[0].path == tiny_bundle and len(beside.bundles) == len(PACKAGES)  # en→ja: the bundle's
    assert {o.folder.name: o.state for o in beside.packages}["translate-en_ja-1_0"] == "shadowed"
    shipped = startup.check(
        Settings(bundles=[tiny_bundle], argos_packages=packages, argos_cache=cache, shipped_bundles=tiny_bundle)
    )  # the user's package serves en→ja: the shipped bundle is shadowed
    assert tiny_bundle not in [b.path for b in shipped.bundles] and len(shipped.bundles) == len(PACKAGES)
    assert [(s.path, s.pair) for s in shipped.shadowed] == [(tiny_bundle, ("en", "ja"))]
    assert {o.folder.name: o.state for o in shipped.packages}["translate-en_ja-1_0"] == "cached"
