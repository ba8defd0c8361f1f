"""``attnserve serve``'s start-up, on real processes: damage and bad settings stop it before it listens, in one
line with exit code 2; once the checks pass it listens while it loads, /readyz 503 until warm."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from service.runtime.bundle import load_bundle
from service.runtime.manifest import MANIFEST, Manifest, sha256
from service.serving.budget import MiB
from service.serving.catalog import footprint
from service.serving.startup import StartupError, check
from service.settings import Settings
from tests.service.process import REPO, ServeProcess, free_port


def serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``attnserve serve`` with only ``env``'s ATTNSERVE_* settings, to its end (a healthy one would not end)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    return subprocess.run(
        [sys.executable, "-c", "from service.cli.main import main; exit(main())", "serve", *args],
        cwd=REPO,
        env={**base, "ATTNSERVE_PORT": str(free_port()), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def edit_manifest(bundle: Path, change: Callable[[dict], None]) -> None:
    manifest = Manifest.read(bundle)
    change(manifest.data)
    manifest.write(bundle)


def truncate(bundle: Path) -> None:
    data = (bundle / "decoder.onnx").read_bytes()
    (bundle / "decoder.onnx").write_bytes(data[: len(data) // 2])


def flip_a_byte(bundle: Path) -> None:
    data = bytearray((bundle / "encoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "encoder.onnx").write_bytes(bytes(data))


def shrink_vocab(m: dict) -> None:
    m["model"]["vocab_size"] = 100


# (damage to a copy of the tiny bundle, what the line must name, what it must say to do)
DAMAGE: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "no directory": (lambda b: shutil.rmtree(b), "no such bundle directory", "ATTNSERVE_BUNDLES"),
    "no manifest": (lambda b: (b / MANIFEST).unlink(), MANIFEST, "attnserve export"),
    "truncated manifest": (
        lambda b: (b / MANIFEST).write_text((b / MANIFEST).read_text()[:200]),
        "manifest.json: not valid JSON",
        "",
    ),
    "missing file": (lambda b: (b / "spm.model").unlink(), "spm.model is missing", ""),
    "truncated graph": (truncate, "decoder.onnx: sha256 does not match", "corrupted or replaced"),
    "altered graph": (flip_a_byte, "encoder.onnx: sha256 does not match", "corrupted or replaced"),
    "old format": (
        lambda b: edit_manifest(b, lambda m: m.update(format="attnserve-bundle/3")),
        "format 'attnserve-bundle/3'",
        "export it again",
    ),
    "manifest without tokenizer": (
        lambda b: edit_manifest(b, lambda m: m.pop("tokenizer")),
        "manifest.json: malformed manifest (KeyError: 'tokenizer')",
        "export the bundle again",
    ),
    "vocabulary smaller than the tokenizer's": (
        lambda b: edit_manifest(b, shrink_vocab),
        "model.vocab_size=100, but the source tokenizer has 380 pieces",
        "do not belong together",
    ),
    "graph form missing": (
        lambda b: edit_manifest(b, lambda m: m["graph_forms"].pop("decoder.fast.onnx")),
        "graph_forms['decoder.fast.onnx'] is missing",
        "",
    ),
}


def check_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnserve: "), result.stderr
    assert result.stdout == ""  # nothing of uvicorn's: it never started
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_bundle_stops_start_up_in_one_line(kind: str, tiny_bundle: Path, tmp_path: Path) -> None:
    damage, names, todo = DAMAGE[kind]
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    damage(bundle)
    line = check_one_line(serve({"ATTNSERVE_BUNDLES": str(bundle)}), names, todo)
    assert str(bundle) in line  # the file or directory, by its path


def test_damaged_derived_graph_stops_start_up_in_one_line(tiny_int8_bundle: Path, tmp_path: Path) -> None:
    """A derived graph (the cache of service/runtime/derive.py) that differs from the manifest's sha256 is named, with
    how to derive it again; deleted, it is derived again and the same checks pass."""
    bundle = Path(shutil.copytree(tiny_int8_bundle, tmp_path / "bundle"))
    load_bundle(bundle)  # derives it
    data = bytearray((bundle / "decoder.int8.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / "decoder.int8.onnx").write_bytes(bytes(data))
    line = check_one_line(serve({"ATTNSERVE_BUNDLES": str(bundle)}), "decoder.int8.onnx: sha256", "derive it again")
    assert str(bundle) in line
    (bundle / "decoder.int8.onnx").unlink()
    load_bundle(bundle)
    assert sha256(bundle / "decoder.int8.onnx") == Manifest.read(bundle).sha256["decoder.int8.onnx"]


def test_two_bundles_of_one_pair(tiny_bundle: Path, tmp_path: Path) -> None:
    other = shutil.copytree(tiny_bundle, tmp_path / "other")
    result = serve({"ATTNSERVE_BUNDLES": f"{tiny_bundle},{other}"})
    check_one_line(result, "both translate en→ja", "one bundle per pair")


# (settings, what the line must name, what it must say to do)
SETTINGS: dict[str, tuple[dict[str, str], str, str]] = {
    "not a number": ({"ATTNSERVE_MAX_BATCH_SIZE": "zero"}, "ATTNSERVE_MAX_BATCH_SIZE='zero'", "valid integer"),
    "out of range": ({"ATTNSERVE_SHUTDOWN_TIMEOUT_S": "0"}, "ATTNSERVE_SHUTDOWN_TIMEOUT_S='0'", "greater than 0"),
    "unknown provider": ({"ATTNSERVE_PROVIDER": "tpu"}, "ATTNSERVE_PROVIDER='tpu'", "'auto', 'cuda' or 'cpu'"),
    "cuda without cuda": ({"ATTNSERVE_PROVIDER": "cuda"}, "ATTNSERVE_PROVIDER=cuda", "install onnxruntime-gpu"),
    "no bundle": ({"ATTNSERVE_BUNDLES": " "}, "ATTNSERVE_BUNDLES is empty", "name at least one"),
    "keys file unreadable": ({"ATTNSERVE_API_KEYS_FILE": "/nonexistent/k"}, "ATTNSERVE_API_KEYS_FILE", "cannot read"),
    "variant not in the bundle": ({"ATTNSERVE_GRAPH_VARIANT": "int8"}, "no 'int8' graphs", "this bundle has"),
    "defaults of a pair not served": (
        {"ATTNSERVE_PAIR_DEFAULTS": '{"en-de": {"beam_size": 4}}'},
        "ATTNSERVE_PAIR_DEFAULTS names 'en-de'",
        "it serves en-ja",
    ),
}


@pytest.mark.parametrize("kind", SETTINGS)
def test_bad_setting_stops_start_up_in_one_line(kind: str, tiny_bundle: Path) -> None:
    env, names, todo = SETTINGS[kind]
    check_one_line(serve({"ATTNSERVE_BUNDLES": str(tiny_bundle), **env}), names, todo)


def test_address_in_use(tiny_bundle: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve({"ATTNSERVE_BUNDLES": str(tiny_bundle), "ATTNSERVE_PORT": str(port)})
    check_one_line(result, f"cannot listen on 127.0.0.1:{port}", "ATTNSERVE_PORT")


def test_graph_that_onnx_runtime_refuses_ends_the_process_after_listening(tiny_bundle: Path, tmp_path: Path) -> None:
    """A graph whose checksum matches but which ONNX Runtime cannot load passes the checks before listening: the
    background load fails, logs one line naming the file, and the process exits with code 2, no traceback."""
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    (bundle / "decoder.fast.onnx").write_bytes(b"not a graph")
    edit_manifest(bundle, lambda m: m["sha256"].update({"decoder.fast.onnx": sha256(bundle / "decoder.fast.onnx")}))
    server = ServeProcess(tmp_path / "log", bundles=bundle)
    try:
        assert server.wait() == 2
        log = server.text()
    finally:
        server.stop()
    assert "Traceback" not in log
    (failure,) = [line for line in log.splitlines() if "ERROR" in line]
    assert "start-up failed" in failure and "decoder.fast.onnx" in failure, failure


def test_listens_while_loading_and_is_ready_once_warm(tiny_bundle: Path, tmp_path: Path) -> None:
    """Warm-up waits for a gate file: until it opens, /healthz is 200, /readyz, the work endpoints and those that
    answer the served languages 503 with Retry-After; then /readyz turns 200 and /translate answers."""
    gate = tmp_path / "gate"
    body = {"q": "Open file", "source": "en", "target": "ja"}
    with ServeProcess(tmp_path / "log", warm_up_gate=gate, bundles=tiny_bundle) as server:
        server.wait_listening()
        with httpx.Client(base_url=server.url, timeout=10) as client:
            assert client.get("/healthz").status_code == 200
            for _ in range(3):
                ready = client.get("/readyz")
                assert ready.status_code == 503 and ready.headers["Retry-After"] == "1"
                assert "loading the models" in ready.json()["error"]
                for path, extra in (("/translate", {}), ("/attention", {"kinds": ["cross"]})):
                    busy = client.post(path, json=body | extra)
                    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1", busy.text
                    assert "not ready" in busy.json()["error"]
                for busy in (  # the engines are there, warming up: what they serve is not answered yet either
                    client.get("/languages"),
                    client.get("/frontend/settings"),
                    client.post("/detect", json={"q": " "}),
                    client.post("/translate", json=body | {"source": "auto"}),
                ):
                    assert busy.status_code == 503 and busy.headers["Retry-After"] == "1", busy.text
                    assert "not ready" in busy.json()["error"]
            gate.touch()
            server.wait_ready(timeout=30)
            assert client.get("/readyz").json()["status"] == "ready"
            assert client.post("/translate", json=body).status_code == 200
        server.terminate()
        assert server.wait() == 0


def policies(pid: int) -> set[int]:
    """The scheduling policies of a process's threads."""
    found = set()
    for thread in os.listdir(f"/proc/{pid}/task"):
        with suppress(ProcessLookupError):  # it ended meanwhile
            found.add(os.sched_getscheduler(int(thread)))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH: Linux only")
@pytest.mark.parametrize("sched_batch", ["always", "saturated", "off"])
def test_every_thread_runs_under_sched_batch_as_set(sched_batch: str, tiny_bundle: Path, tmp_path: Path) -> None:
    """always: from start-up; saturated: while the batch is full (here 2 rows, with 24 texts waiting), and no
    longer once it has emptied; off: never."""
    env = {"max_batch_size": 2, "max_texts": 24, "warmup": "false"}
    with ServeProcess(tmp_path / "log", bundles=tiny_bundle, sched_batch=sched_batch, **env) as server:
        server.wait_ready()
        pid, seen, stop = server.process.pid, set(), threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen.update(policies(pid))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            texts = [f"Open file number {i} in the editor and save it" for i in range(24)]
            body = {"q": texts, "source": "en", "target": "ja", "max_length": 64}
            assert httpx.post(server.url + "/translate", json=body, timeout=60).is_success
        finally:
            stop.set()
            watcher.join()
        after = policies(pid)
    batch, other = os.SCHED_BATCH, os.SCHED_OTHER
    assert (seen, after) == {"always": ({batch}, {batch}), "saturated": ({batch, other}, {other}),
                             "off": ({other}, {other})}[sched_batch]  # fmt: skip


def test_a_bundle_larger_than_the_models_memory_bound_stops_start_up(tiny_bundle: Path, tmp_path: Path) -> None:
    """A bundle that could never load under ATTNSERVE_MODELS_MEMORY_MB, counted by its loaded weights, is named
    before the server listens."""
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "big"))
    graph = onnx.load(str(bundle / "decoder.fast.onnx"), load_external_data=False)
    graph.graph.initializer.append(numpy_helper.from_array(np.zeros((1 << 20) // 4, np.float32), "padding"))
    onnx.save(graph, str(bundle / "decoder.fast.onnx"))  # 1 MiB more of weights
    edit_manifest(bundle, lambda m: m["sha256"].update({"decoder.fast.onnx": sha256(bundle / "decoder.fast.onnx")}))
    size = -(-footprint(load_bundle(bundle), None) // MiB)
    with pytest.raises(StartupError, match=rf"big: its weights take {size} MiB loaded, more than .*_MB={size - 1}"):
        check(Settings(bundles=[bundle], models_memory_mb=size - 1))
    assert check(Settings(bundles=[bundle], models_memory_mb=size))
    (bundle / "decoder.fast.onnx").write_bytes(b"not a graph")
    edit_manifest(bundle, lambda m: m["sha256"].update({"decoder.fast.onnx": sha256(bundle / "decoder.fast.onnx")}))
    with pytest.raises(StartupError, match=r"big: its graphs cannot be read: .*decoder.fast.onnx: not an ONNX graph"):
        check(Settings(bundles=[bundle], models_memory_mb=size))


def test_the_users_bundle_serves_a_pair_a_shipped_one_serves_too(
    tiny_bundle: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.service.pair_bundles import pair_bundle

    shipped = tmp_path / "shipped"
    en_de, en_ja = pair_bundle(tiny_bundle, shipped, "en", "de"), pair_bundle(tiny_bundle, shipped, "en", "ja")
    mine = pair_bundle(tiny_bundle, tmp_path / "mine", "en", "de")
    checked = check(Settings(bundles=[shipped, mine], shipped_bundles=shipped))
    assert [b.path for b in checked.bundles] == [en_ja, mine]  # BUNDLES' order, the shadowed one left out
    assert [(s.path, s.pair, s.by) for s in checked.shadowed] == [(en_de, ("en", "de"), mine)]
    assert f"{en_de}: shadowed, not served: {mine}, the user's, serves en→de" in caplog.text
    with pytest.raises(StartupError, match="both translate en→de"):  # two of the user's: which one is not known
        check(Settings(bundles=[mine, shutil.copytree(mine, tmp_path / "again")], shipped_bundles=shipped))
