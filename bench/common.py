"""What the benchmark scripts share: test sentences, a server in a subprocess, the machine's description, and the
sections of docs/BENCHMARKS.md. The scripts import it as a sibling (``python bench/NAME.py`` puts bench/ on the path).
"""

from __future__ import annotations

import os
import platform
import random
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(__file__).resolve().with_name("peers.py")  # runs one engine, or the transformers service, alone
DOCS = ROOT / "docs"
CORPUS = Path.home() / ".cache" / "attnserve" / "corpus" / "en-ja" / "test.tsv"
FALLBACK = ["Open file", "Save as…", "Delete the selected files?", "Settings", "Could not open %s: permission denied"]


def pairs(path: Path, n: int = 1000) -> list[tuple[str, str | None]]:
    """A deterministic sample of ``n`` (source, reference) pairs from a TSV (source, reference, ...); the built-in
    list, without references, when the file is missing."""
    if not path.exists():
        return [(text, None) for text in FALLBACK[:n]]
    rows = [ln.split("\t") for ln in path.read_text(encoding="utf-8").splitlines()]
    sample = random.Random(0).sample(rows, min(n, len(rows)))
    return [(r[0], r[1] if len(r) > 1 else None) for r in sample]


def texts(path: Path, n: int = 1000) -> list[str]:
    """The source side of :func:`pairs` (the same sample)."""
    return [source for source, _ in pairs(path, n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """An HTTP server in a subprocess on 127.0.0.1: ready when ``GET /readyz`` (``probe``) answers 200, terminated
    on exit.

    Args:
        command: the command line; it must listen on ``port``.
        port: the loopback port the command listens on.
        env: extra environment variables.
        ready_timeout: seconds to wait for readiness.
        probe: the path that answers 200 once it is ready (a server without /readyz: another path).
    """

    def __init__(
        self,
        command: list[str],
        port: int,
        env: dict[str, str] | None = None,
        ready_timeout: float = 120,
        probe: str = "/readyz",
    ) -> None:
        self.port = port
        self.probe = probe
        self.url = f"http://127.0.0.1:{port}"
        self.ready_timeout = ready_timeout
        self.process = subprocess.Popen(command, env={**os.environ, **(env or {})}, cwd=ROOT)

    def __enter__(self) -> Server:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.process.returncode} before it was ready")
            try:
                if httpx.get(self.url + self.probe, timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not become ready in {self.ready_timeout:g} s")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def peak_rss_mb(self) -> float | None:
        """The server process's peak resident memory so far."""
        return peak_rss_mb(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """A process's peak resident memory in MiB (VmHWM in /proc), or None where /proc does not say.

    Not ``ru_maxrss``: Linux carries it across ``execve``, so a child started by a big parent reports the parent's.
    """
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def attnserve_server(bundle: Path, env: dict[str, str]) -> Server:
    """``attnserve serve`` of one bundle on a free loopback port, with extra ``ATTNSERVE_*`` settings."""
    port = free_port()
    attnserve = str(Path(sys.executable).with_name("attnserve"))
    command = [attnserve, "serve", "--bundle", str(bundle), "--port", str(port)]
    return Server(command, port, {"ATTNSERVE_LOG_LEVEL": "warning", **env})


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions(*packages: str) -> str:
    """``name version`` of each installed package, e.g. ``onnxruntime 1.20.1, ctranslate2 4.5.0``."""
    found = []
    for name in packages:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def machine() -> str:
    """One line: CPU model, cores, OS and Python."""
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu_model()}, {os.cpu_count()} cores, {system}, Python {platform.python_version()}"


def write_section(name: str, body: str, path: Path = DOCS / "BENCHMARKS.md") -> None:
    """Replace (or append) the ``<!-- bench:name -->`` section of docs/BENCHMARKS.md (or of ``path``)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nWritten by the scripts in bench/.\n"
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
