"""The CPU and GPU images, built from the Dockerfile as it is and run as docker-compose.yml runs its api service; the
GPU image on a machine without a GPU, where ATTNSERVE_PROVIDER=auto serves on the CPU; and the LibreTranslate switch
(docker-compose.libretranslate.yml), the server importing Argos packages from LibreTranslate's volume by itself.

A Docker engine is used if one answers; otherwise the test starts its own (vfs storage, no bridge, no iptables,
its data under /var/lib/attnserve-image-test, kept between runs as a cache, removed under CI=true: the vfs storage
driver copies every layer whole, tens of gigabytes) and stops it at the end. Where the base
image cannot be pulled, a stand-in with the same tag is built from Debian packages with debootstrap (the offline
build path, docs/DEPLOY.md). Builds, logs and the measurements (image.json) go to test-artifacts/image/.

Marked `image`: it runs in `make image-test` (pytest -m image) and, under CI=true, in `make test`; elsewhere it is
skipped. Under CI=true a missing tool or engine fails it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from .conftest import IMAGE_ARGOS_CACHE, REPO, require_tool
from .test_prometheus_live import free_port

pytestmark = [pytest.mark.image, pytest.mark.timeout(2400)]

DEBIAN_CLI = Path("/usr/bin/docker")  # Debian's docker.io: its CLI uses BuildKit only with DOCKER_BUILDKIT=1
BASE = "python:3.11-slim-bookworm"  # the Dockerfile's PYTHON_IMAGE
TAG = "attnserve:image-test"
GPU_TAG = "attnserve:image-test-gpu"
STATE = Path("/var/lib/attnserve-image-test")
RUN = Path("/run/attnserve-image-test")
MIRROR = "http://deb.debian.org/debian"
# python:3.11-slim has python, venv and the C headers the builder compiles the extensions against.
STAND_IN_PACKAGES = ("python3", "python3-venv", "python3-dev", "python-is-python3", "ca-certificates")
STAND_IN_LABEL = "org.attnserve.stand-in"
# Answers are held to the host's and CTranslate2's decoding, which the tests run without the repetition guard
# (tests/conftest.py): random-weight test models loop on nearly every text.
GUARD_OFF = "--env=ATTNSERVE_REPETITION_GUARD=false"
STAND_IN_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    f'LABEL {STAND_IN_LABEL}="debootstrap bookworm minbase: {" ".join(STAND_IN_PACKAGES)}, the host CA store"',
    'CMD ["python3"]',
)
ARTIFACTS = REPO / "test-artifacts" / "image"
TEXTS = ["Open file", "The file could not be saved."]
# Concurrent requests that keep two cores busy for seconds, so that SIGTERM arrives while they are decoded; each
# request stays far inside the limits a single request may have.
DRAIN_TEXT = "Please check the network settings and try again after restarting the application, then save file {}."
DRAIN_TEXTS = 16
DRAIN_REQUESTS = 24


def need(condition: object, message: str) -> None:
    """Skip the test when ``condition`` is false, or fail it under CI=true, where every tool is installed."""
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@dataclass(frozen=True)
class Docker:
    """The docker CLI, talking to one engine (``env`` holds its DOCKER_HOST, if not the default)."""

    cli: str
    env: dict[str, str]
    own: bool = False  # the engine was started by this test

    def run(
        self, *args: str, timeout: float = 120, log: Path | None = None, stdin: Any = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS`` and return the result; with ``log``, its output goes there instead."""
        if log is None:
            return subprocess.run(
                [self.cli, *args], env=self.env, stdin=stdin, capture_output=True, text=True, timeout=timeout
            )
        with log.open("w") as out:
            return subprocess.run(
                [self.cli, *args], env=self.env, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, text=True,
                timeout=timeout,
            )  # fmt: skip

    def __call__(self, *args: str, timeout: float = 120, log: Path | None = None, stdin: Any = None) -> str:
        """Run ``docker ARGS`` and return its standard output; a non-zero exit fails the test with its output."""
        result = self.run(*args, timeout=timeout, log=log, stdin=stdin)
        output = log.read_text()[-6000:] if log is not None else result.stdout + result.stderr
        assert result.returncode == 0, f"docker {' '.join(args)} exited with {result.returncode}:\n{output}"
        return result.stdout or ""

    def answers(self) -> bool:
        """Whether the engine answers."""
        try:
            return self.run("version", "--format", "{{.Server.Version}}", timeout=15).returncode == 0
        except subprocess.TimeoutExpired:
            return False


def wait_until(what: str, done: Callable[[], bool], timeout: float, alive: Callable[[], str | None]) -> float:
    """Poll ``done`` until true and return the seconds it took; ``alive`` returns why waiting is pointless, or None."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if done():
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        reason = alive()
        if reason is not None:
            pytest.fail(f"{what}: {reason}")
        time.sleep(0.2)
    pytest.fail(f"{what}: not after {timeout} s")


@pytest.fixture(scope="module", autouse=True)
def selected(request: pytest.FixtureRequest) -> None:
    """Skip unless CI=true or the `image` marker was asked for."""
    if os.environ.get("CI") != "true" and "image" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("builds and runs the Docker image (minutes, as root): `make image-test`, or CI=true")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="module")
def report() -> Iterator[dict[str, Any]]:
    """The measurements, written to test-artifacts/image/image.json when the module ends."""
    values: dict[str, Any] = {}
    yield values
    (ARTIFACTS / "image.json").write_text(json.dumps(values, indent=2) + "\n")


@pytest.fixture(scope="module")
def docker(report: dict[str, Any]) -> Iterator[Docker]:
    """A Docker engine: the one that answers, or one this fixture starts (as root) and stops."""
    cli = str(DEBIAN_CLI) if DEBIAN_CLI.exists() else shutil.which("docker")
    need(cli, "no docker CLI (apt-get install docker.io)")
    assert cli is not None
    existing = Docker(cli, os.environ | {"DOCKER_BUILDKIT": "1"})
    report["docker_cli"] = existing.run("version", "--format", "{{.Client.Version}}", timeout=15).stdout.strip()
    if existing.answers():
        report["engine"] = "existing"
        report["docker_engine"] = existing("version", "--format", "{{.Server.Version}}").strip()
        yield existing
        return
    with own_engine(Docker(cli, existing.env | {"DOCKER_HOST": f"unix://{RUN}/docker.sock"}, own=True)) as own:
        report["engine"] = "started"
        report["docker_engine"] = own("version", "--format", "{{.Server.Version}}").strip()
        yield own


@contextmanager
def own_engine(docker: Docker) -> Iterator[Docker]:
    """Run dockerd for ``docker``'s socket, its state under STATE and RUN, until the block ends."""
    dockerd = shutil.which("dockerd")
    need(dockerd and os.geteuid() == 0, "no Docker engine answers, and starting one needs dockerd and root")
    assert dockerd is not None
    RUN.mkdir(parents=True, exist_ok=True)
    args = [dockerd, "--storage-driver=vfs", "--bridge=none", "--iptables=false", "--ip-forward=false",
            f"--data-root={STATE}/docker", f"--exec-root={RUN}", f"--pidfile={RUN}/docker.pid",
            f"--host={docker.env['DOCKER_HOST']}"]  # fmt: skip
    log = ARTIFACTS / "dockerd.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def exited() -> str | None:
        return None if process.poll() is None else f"exited {process.returncode}:\n{log.read_text()[-3000:]}"

    try:
        wait_until("dockerd", docker.answers, 60, exited)
        yield docker
    finally:
        process.send_signal(signal.SIGTERM)  # it stops its containers and its containerd
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if os.path.ismount(RUN / "netns/default"):  # dockerd leaves its network namespace mounted
            subprocess.run(["umount", str(RUN / "netns/default")], check=False)
        if os.environ.get("CI") == "true":
            shutil.rmtree(STATE, ignore_errors=True)


def image_size(docker: Docker, tag: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", tag))


def build_stand_in(docker: Docker, work: Path) -> None:
    """Tag a Debian bookworm built with debootstrap as BASE: the offline build path (docs/DEPLOY.md)."""
    need(shutil.which("debootstrap") and os.geteuid() == 0, f"{BASE} cannot be pulled: a stand-in needs debootstrap")
    root = work / "rootfs"
    debootstrap = ["debootstrap", "--variant=minbase", "--include=" + ",".join(STAND_IN_PACKAGES)]
    with (ARTIFACTS / "debootstrap.log").open("w") as out:
        result = subprocess.run([*debootstrap, "bookworm", str(root), MIRROR], stdout=out, stderr=subprocess.STDOUT,
                                timeout=1200, check=False)  # fmt: skip
    assert result.returncode == 0, (ARTIFACTS / "debootstrap.log").read_text()[-3000:]
    # No package lists and no downloaded packages, as in python:3.11-slim.
    shutil.rmtree(root / "var/lib/apt/lists")
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    # The host's CA store, its links followed (they point into the host's tree), so pip in the build trusts what
    # the host trusts, a TLS-inspecting proxy's CA included. The old tree goes first: writing through its absolute
    # links would write into the host's files.
    certs = root / "etc/ssl/certs"
    shutil.rmtree(certs)
    shutil.copytree("/etc/ssl/certs", certs, symlinks=False, ignore_dangling_symlinks=True)
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    changes = [arg for change in STAND_IN_CHANGES for arg in ("--change", change)]
    docker("import", *changes, "-", BASE, stdin=tar.stdout, timeout=600)
    assert tar.wait() == 0, "tar of the stand-in's root failed"
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def base(docker: Docker, report: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> str:
    """BASE, present, pulled, or built as a stand-in."""
    started = time.monotonic()
    if docker.run("image", "inspect", BASE).returncode == 0:
        labels = docker("image", "inspect", "--format", "{{json .Config.Labels}}", BASE)
        report["base"] = "stand-in, cached" if STAND_IN_LABEL in labels else "present"
    elif docker.run("pull", BASE, timeout=600).returncode == 0:
        report["base"] = "pulled"
    else:
        build_stand_in(docker, tmp_path_factory.mktemp("stand-in"))
        report["base"] = "stand-in, built"
    report["base_seconds"] = round(time.monotonic() - started, 1)
    report["base_size_bytes"] = image_size(docker, BASE)
    return BASE


def build(docker: Docker, target: str, tag: str, report: dict[str, Any], prefix: str = "") -> str:
    """Build ``target`` as ``tag`` with BuildKit, the build's pip on the host's network; its time, its image's size
    and the disk the build took (the engine's free space before and after) go to ``report`` under ``prefix``."""
    disk = Path(docker("info", "--format", "{{.DockerRootDir}}").strip())
    free, started = shutil.disk_usage(disk).free, time.monotonic()
    command = ["build", "--network", "host", "--target", target, "--progress", "plain", "--tag", tag, str(REPO)]
    docker(*command, timeout=2400, log=ARTIFACTS / f"{prefix}build.log")
    report[f"{prefix}build_seconds"] = round(time.monotonic() - started, 1)
    report[f"{prefix}image_size_bytes"] = image_size(docker, tag)
    if docker.own:  # the images the tag left behind, in the test's own engine only
        docker("image", "prune", "--force")
    report[f"{prefix}build_disk_bytes"] = free - shutil.disk_usage(disk).free
    return tag


@pytest.fixture(scope="module")
def image(docker: Docker, base: str, report: dict[str, Any]) -> str:
    """The CPU target."""
    return build(docker, "cpu", TAG, report)


@pytest.fixture(scope="module")
def gpu_image(docker: Docker, base: str, report: dict[str, Any]) -> str:
    """The GPU target: onnxruntime-gpu and the CUDA libraries' wheels on the same base."""
    return build(docker, "gpu", GPU_TAG, report, "gpu_")


def compose_flags(api: dict[str, Any] | None = None) -> list[str]:
    """`docker run` flags for a compose service (docker-compose.yml's api by default): its environment, its user and
    its hardening."""
    api = api or yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["api"]
    flags = [f"--env={name}={value}" for name, value in api.get("environment", {}).items()]
    flags += [f"--user={api['user']}"] if "user" in api else []
    flags += ["--read-only"] if api.get("read_only") else []
    flags += [f"--tmpfs={path}" for path in api.get("tmpfs", [])]
    flags += [f"--cap-drop={cap}" for cap in api.get("cap_drop", [])]
    flags += [f"--security-opt={option}" for option in api.get("security_opt", [])]
    return flags


@dataclass
class Container:
    """The running image: its name, URL and the time it was started."""

    name: str
    url: str
    started: float
    docker: Docker = field(repr=False)

    def state(self) -> dict[str, Any]:
        return dict(json.loads(self.docker("inspect", "--format", "{{json .State}}", self.name)))

    def gone(self) -> str | None:
        """Why it is no longer running, with its log; None while it runs."""
        state = self.state()
        if state["Running"]:
            return None
        return f"the container exited with {state['ExitCode']}:\n{self.docker.run('logs', self.name).stderr[-4000:]}"


@contextmanager
def serving(
    docker: Docker, image: str, report: dict[str, Any], prefix: str = "", env: tuple[str, ...] = ()
) -> Iterator[Container]:
    """``image`` running with host networking on a free port, ready (GET /readyz is 200), with ``env`` (NAME=VALUE)
    besides compose's; the seconds from `docker run` to ready go to ``report`` under ``prefix``. Removed at the end,
    its log kept in test-artifacts/image."""
    port, name = free_port(), f"attnserve-image-test-{prefix}{os.getpid()}"
    started = time.monotonic()
    run = ["run", "--detach", "--name", name, "--network", "host", f"--env=ATTNSERVE_PORT={port}", GUARD_OFF,
           *compose_flags()]  # fmt: skip
    docker(*run, *(f"--env={variable}" for variable in env), image)
    running = Container(name, f"http://127.0.0.1:{port}", started, docker)
    try:
        ready = lambda: httpx.get(f"{running.url}/readyz", timeout=2).status_code == 200  # noqa: E731
        wait_until("GET /readyz", ready, 180, running.gone)
        report[f"{prefix}cold_start_seconds"] = round(time.monotonic() - started, 1)
        yield running
    finally:
        logs = docker.run("logs", name)
        (ARTIFACTS / f"{prefix}container.log").write_text(logs.stdout + logs.stderr)
        docker.run("rm", "--force", name)


@pytest.fixture(scope="module")
def container(docker: Docker, image: str, report: dict[str, Any]) -> Iterator[Container]:
    """The CPU image, as compose runs it."""
    with serving(docker, image, report) as running:
        yield running


@pytest.fixture(scope="module")
def gpu_container(docker: Docker, gpu_image: str, report: dict[str, Any]) -> Iterator[Container]:
    """The GPU image on this machine, which has no GPU: ATTNSERVE_PROVIDER=auto (the image says cuda)."""
    with serving(docker, gpu_image, report, "gpu_", ("ATTNSERVE_PROVIDER=auto",)) as running:
        yield running


def host_translations(texts: list[str], pair: str = "en-ja") -> list[str]:
    """What this checkout's `attnserve translate` gives for ``texts`` with the shipped bundle of ``pair``."""
    local = [require_tool("attnserve"), "translate", "--json", "--bundle", str(REPO / "model/bundles" / pair)]
    return list(json.loads(subprocess.run([*local, *texts], capture_output=True, text=True, check=True).stdout))


def test_the_server_runs_as_user_10001(container: Container) -> None:
    status = container.docker("exec", container.name, "cat", "/proc/1/status")
    command = container.docker("exec", container.name, "cat", "/proc/1/cmdline").split("\0")
    assert "serve" in command, f"process 1 is not the server: {command}"
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    gids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Gid:"))
    assert set(uids) == {"10001"} and set(gids) == {"10001"}, f"uids {uids}, gids {gids}"


def test_the_healthcheck_turns_healthy(container: Container, report: dict[str, Any]) -> None:
    healthy = lambda: container.state()["Health"]["Status"] == "healthy"  # noqa: E731
    wait_until("HEALTHCHECK", healthy, 150, container.gone)
    report["healthy_seconds"] = round(time.monotonic() - container.started, 1)


def test_every_shipped_pair_is_served_with_its_int8_graphs(container: Container) -> None:
    languages = httpx.get(f"{container.url}/languages", timeout=30).json()
    assert sorted(next(entry["targets"] for entry in languages if entry["code"] == "en")) == ["de", "ja"]
    for pair in ("en-ja", "en-de"):
        listing = container.docker("exec", container.name, "ls", f"/opt/attnserve/bundles/{pair}").split()
        assert {"encoder.int8.onnx", "decoder.int8.onnx"} <= set(listing), f"{pair}: int8 not derived at build time"
    answer = httpx.post(f"{container.url}/translate", json={"q": TEXTS, "source": "en", "target": "de"}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["translatedText"] == host_translations(TEXTS, "en-de")


def test_translate_and_attention_answer_as_on_the_host(container: Container) -> None:
    expected = host_translations(TEXTS)
    body = {"q": TEXTS, "source": "en", "target": "ja"}
    answer = httpx.post(f"{container.url}/translate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["translatedText"] == expected

    answer = httpx.post(f"{container.url}/attention", json=body | {"q": TEXTS[0]}, timeout=60)
    assert answer.status_code == 200, answer.text
    attention = answer.json()
    assert attention["translatedText"] == expected[0]
    source, target = len(attention["source_tokens"]), len(attention["target_tokens"])
    for kind, rows, columns in (("encoder", source, source), ("decoder", target, target), ("cross", target, source)):
        for layer in attention[kind]:
            for head in layer:
                assert len(head) == rows and all(len(row) == columns for row in head), kind
                assert all(abs(sum(row) - 1) < 1e-4 for row in head), f"{kind}: a row that does not sum to 1"


def test_sigterm_answers_every_request_in_flight(container: Container, report: dict[str, Any]) -> None:
    answered: list[tuple[float, httpx.Response]] = []
    stopped: list[float] = []

    connected = threading.Barrier(DRAIN_REQUESTS + 1)

    def send(number: int) -> None:
        texts = [DRAIN_TEXT.format(number * DRAIN_TEXTS + i) for i in range(DRAIN_TEXTS)]  # distinct: none is reused
        body = {"q": texts, "source": "en", "target": "ja", "beam_size": 4}
        with httpx.Client(base_url=container.url, timeout=120) as client:
            client.get("/healthz").raise_for_status()  # connected before SIGTERM closes the listening socket
            connected.wait(timeout=60)
            response = client.post("/translate", json=body)
        answered.append((time.monotonic(), response))

    def stop() -> None:
        container.docker("stop", "--time", "60", container.name, timeout=90)
        stopped.append(time.monotonic())

    requests = [threading.Thread(target=send, args=(number,)) for number in range(DRAIN_REQUESTS)]
    for thread in requests:
        thread.start()
    connected.wait(timeout=60)
    time.sleep(0.5)  # every request accepted, most still waiting or being decoded
    stop_sent = time.monotonic()
    stopper = threading.Thread(target=stop)
    stopper.start()
    time.sleep(0.5)
    try:
        late: int | None = httpx.get(f"{container.url}/readyz", timeout=5).status_code
    except httpx.TransportError:
        late = None  # refused: the listening socket is closed
    for thread in [*requests, stopper]:
        thread.join(timeout=150)

    assert len(answered) == DRAIN_REQUESTS and stopped, "a request or docker stop did not finish"
    for _, response in answered:
        assert response.status_code == 200, response.text
        texts = response.json()["translatedText"]
        assert len(texts) == DRAIN_TEXTS and all(texts), "an answer in flight is incomplete"
    last = max(at for at, _ in answered)
    assert last > stop_sent + 0.5, "every request was answered before SIGTERM: raise DRAIN_REQUESTS"
    assert late in (None, 503), f"GET /readyz after SIGTERM: {late} (expected refused or 503)"
    state = container.state()
    assert state["ExitCode"] == 0 and not state["OOMKilled"], f"exit {state['ExitCode']}: not a graceful shutdown"
    report["drain_answered_after_sigterm"] = sum(at > stop_sent for at, _ in answered)
    report["drain_last_answer_seconds"] = round(last - stop_sent, 1)
    report["drain_stop_seconds"] = round(stopped[0] - stop_sent, 1)


# The LibreTranslate switch (docs/DEPLOY.md, "Replacing LibreTranslate in a compose file"): LibreTranslate's models
# volume as its image leaves it (the packages under .local, owned by its user 1032), and
# docker-compose.libretranslate.yml run as compose runs it, on that volume and a new cache volume, on port 5000.
LIBRETRANSLATE_UID = 1032


@pytest.fixture(scope="module")
def argos_packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LibreTranslate installation's packages directory: three packages and a broken one, built as the service's
    tests build them (tests/service/argos_installation.py: torch and CTranslate2, in the dev extra)."""
    from tests.bundles import tiny_spm
    from tests.service.argos_installation import build_installation

    root = tmp_path_factory.mktemp("argos")
    return build_installation(root, tiny_spm(root / "spm"))


def switch_log(line: str) -> None:
    """One step of the switch, in test-artifacts/image/switch.log."""
    with (ARTIFACTS / "switch.log").open("a") as out:
        out.write(f"{time.strftime('%H:%M:%S')} {line}\n")


def test_the_libretranslate_switch_imports_in_the_server_and_serves_port_5000(
    docker: Docker, image: str, argos_packages: Path, report: dict[str, Any], tmp_path: Path
) -> None:
    import socket

    from model.importers.argos import import_argos
    from tests.service.argos_installation import BROKEN, PACKAGES, reference_text
    from tests.service.http.test_clients import TEXTS as CLIENT_TEXTS  # those the clients' package tests hold

    lt = pytest.importorskip("libretranslatepy", reason="the LibreTranslate client is in the test extra")
    (ARTIFACTS / "switch.log").unlink(missing_ok=True)
    compose = yaml.safe_load((REPO / "docker-compose.libretranslate.yml").read_text())
    service = compose["services"]["libretranslate"]
    env = service["environment"]
    port, packages_at = int(env["ATTNSERVE_PORT"]), env["ATTNSERVE_ARGOS_PACKAGES"]
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is taken on this host (the container's, too)"
    names = {volume: f"attnserve-image-test-{volume}-{os.getpid()}" for volume in compose["volumes"]}
    mounts = [v.rsplit(":", 2) if v.endswith((":ro", ":rw")) else [*v.rsplit(":", 1), "rw"] for v in service["volumes"]]
    (models, local, _), (cache, cache_at, _) = sorted(mounts, key=lambda m: m[1] == IMAGE_ARGOS_CACHE)
    assert cache_at == IMAGE_ARGOS_CACHE and packages_at.startswith(local + "/")
    name = f"attnserve-image-test-switch-{os.getpid()}"
    try:
        copy = f"mkdir -p {packages_at} && cp -R /src/. {packages_at} && chown -R {LIBRETRANSLATE_UID} {local}"
        docker("run", "--rm", "--user=0", "--network=none", f"--volume={names[models]}:{local}",
               f"--volume={argos_packages}:/src:ro", "--entrypoint=sh", image, "-c", copy)  # fmt: skip
        switch_log(f"LibreTranslate's volume {names[models]}: {sorted(p.name for p in argos_packages.iterdir())}")
        volumes = [f"--volume={names[source]}:{target}:{mode}" for source, target, mode in mounts]
        entry = ["--entrypoint", service["entrypoint"][0], image, *service["entrypoint"][1:], *service["command"]]
        started = time.monotonic()
        docker("run", "--detach", "--name", name, "--network", "host", GUARD_OFF, *compose_flags(service), *volumes,
               *entry)  # fmt: skip
        container = Container(name, f"http://127.0.0.1:{port}", started, docker)
        ready = lambda: httpx.get(f"{container.url}/readyz", timeout=2).status_code == 200  # noqa: E731
        report["switch_import_and_start_seconds"] = round(wait_until("GET /readyz", ready, 900, container.gone), 1)
        switch_log(f"{service['image']} as the libretranslate service, ready on port {port}")

        owner = docker("exec", name, "stat", "-c", "%u:%g", IMAGE_ARGOS_CACHE).strip()
        entries = docker("exec", name, "ls", IMAGE_ARGOS_CACHE).split()
        switch_log(f"cache volume {names[cache]}: owned by {owner}, holds {entries}")
        assert owner == "10001:10001", "Docker created the volume from the image's directory"
        assert sorted(e.rsplit("-", 1)[0] for e in entries if not e.endswith(".refused")) == sorted(PACKAGES)
        log = docker.run("logs", name)
        for package in PACKAGES:
            assert f"argos package {package}: importing" in log.stdout + log.stderr, f"{package}: not imported here"
        assert f"{BROKEN} (en→fr): skipped, refused" in log.stdout + log.stderr

        client = lt.LibreTranslateAPI(f"http://127.0.0.1:{port}/")
        for package, (source, target, *_) in PACKAGES.items():
            bundle = import_argos(argos_packages / package, tmp_path / package)
            for text in CLIENT_TEXTS:
                translated = client.translate(text, source, target)  # urllib: any status but 200 raises
                assert translated == reference_text(argos_packages / package, bundle, text), (package, text)
                switch_log(f"libretranslatepy {source}→{target} {text!r}: 200, {translated!r} (CTranslate2's)")
        assert {"en", "ja", "de"} <= {language["code"] for language in client.languages()}
    finally:
        logs = docker.run("logs", name)
        (ARTIFACTS / "switch-container.log").write_text(logs.stdout + logs.stderr)
        docker.run("rm", "--force", name)
        docker.run("volume", "rm", *names.values())


def gpu_requirements() -> dict[str, str]:
    """The GPU image's pinned packages (deploy/requirements.py --gpu): name -> version."""
    out = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "requirements.py"), "--gpu"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("==") for line in out.splitlines() if "==" in line)


# Run in the GPU container: the ONNX Runtime package, the pinned wheels' versions, and the libraries that
# onnxruntime.preload_dlls() maps (each loads without a GPU; only the CUDA execution provider needs the driver).
GPU_PACKAGES = """
import importlib.metadata as m, json, sys, onnxruntime as o
o.preload_dlls()
installed = {d.metadata["Name"].lower(): d.version for d in m.distributions()}
maps = open("/proc/self/maps").read()
names = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libcurand.so.10", "libcudnn.so.9")
json.dump({"providers": o.get_available_providers(), "installed": installed,
           "loaded": [n for n in names if "/" + n in maps]}, sys.stdout)
"""


def test_gpu_image_holds_onnxruntime_gpu_and_the_pinned_cuda_libraries(gpu_container: Container) -> None:
    found = json.loads(gpu_container.docker("exec", gpu_container.name, "python", "-c", GPU_PACKAGES))
    assert "CUDAExecutionProvider" in found["providers"]
    assert "onnxruntime" not in found["installed"], "onnxruntime beside onnxruntime-gpu: they share a module"
    pinned = gpu_requirements()
    assert "onnxruntime-gpu" in pinned and any(name.startswith("nvidia-cudnn") for name in pinned)
    assert {name: found["installed"].get(name) for name in pinned} == pinned
    assert len(found["loaded"]) == 5, f"preload_dlls() mapped only {found['loaded']}"


def test_gpu_image_serves_on_the_cpu_without_a_gpu(gpu_container: Container) -> None:
    body = {"q": TEXTS, "source": "en", "target": "ja"}
    answer = httpx.post(f"{gpu_container.url}/translate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["translatedText"] == host_translations(TEXTS)
    metrics = httpx.get(f"{gpu_container.url}/metrics", timeout=10).text
    assert 'provider="CPUExecutionProvider"' in metrics and "attnserve_gpu_memory_bytes{" not in metrics
    logs = gpu_container.docker.run("logs", gpu_container.name)
    log = logs.stdout + logs.stderr
    # Why it serves on the CPU, in its log: ONNX Runtime tried CUDA, which needs the driver's libcuda.
    assert "CUDA execution provider unusable: a graph ran on ['CPUExecutionProvider']" in log
    assert "libcuda.so.1" in log


def test_gpu_image_with_provider_cuda_stops_at_start_up_without_a_gpu(gpu_container: Container) -> None:
    # The image's own ATTNSERVE_PROVIDER=cuda, a second server in the running container: it must not listen.
    serve = ["exec", "--env=ATTNSERVE_PROVIDER=cuda", f"--env=ATTNSERVE_PORT={free_port()}", gpu_container.name]
    result = gpu_container.docker.run(*serve, "attnserve", "serve", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "ATTNSERVE_PROVIDER=cuda but ONNX Runtime cannot start CUDA" in result.stderr


def test_size_and_start_up_time_are_reported(
    report: dict[str, Any], record_property: Callable[[str, object], None]
) -> None:
    for prefix in ("", "gpu_"):
        for key in ("image_size_bytes", "cold_start_seconds", "build_seconds", "build_disk_bytes"):
            assert prefix + key in report, f"{prefix + key} was not measured"
        report[f"{prefix}image_size_mb"] = round(report[f"{prefix}image_size_bytes"] / 1e6, 1)
    for key, value in report.items():
        record_property(f"image_{key}", value)
