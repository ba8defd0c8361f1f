"""``attnserve serve`` as a real process on loopback: its exit code, its log (stderr), signals.

``python -m tests.service.process`` runs the same command with test-only slow-downs, read from the environment:
``SLOW_STEP_S`` (seconds added to every decoding step: requests stay in flight) and ``WARM_UP_GATE`` (a file
whose existence warm-up waits for: start-up can be watched).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """``attnserve serve`` with ``ATTNSERVE_*`` settings ``env`` (bundles, port, ...), its log in ``log_path``."""

    def __init__(
        self,
        log_path: Path,
        *,
        slow_step_s: float = 0.0,
        warm_up_gate: Path | None = None,
        args: tuple[str, ...] = (),
        **env: Any,
    ) -> None:
        self.port = int(env.pop("port", free_port()))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        base = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
        # the tests' process-wide repetition guard setting (tests/conftest.py) reaches the server too
        guard = {k: v for k, v in os.environ.items() if k == "ATTNSERVE_REPETITION_GUARD"}
        settings = {
            "ATTNSERVE_PORT": str(self.port),
            **guard,
            **{f"ATTNSERVE_{k.upper()}": str(v) for k, v in env.items()},
        }
        slows = {"SLOW_STEP_S": str(slow_step_s), **({"WARM_UP_GATE": str(warm_up_gate)} if warm_up_gate else {})}
        slow = slow_step_s > 0 or warm_up_gate is not None
        command = ["-m", "tests.service.process"] if slow else ["-c", "from service.cli.main import main; exit(main())"]
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, *command, "serve", *args],
            cwd=REPO,
            env={**base, **settings, **slows, "PYTHONUNBUFFERED": "1"},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60) -> ServeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.text()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not become ready:\n{self.text()}")

    def wait_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/healthz", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.02)
        raise RuntimeError(f"the server did not listen:\n{self.text()}")

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self.log.close()

    def text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self.log.close()

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def slowed(step: Callable[..., Any], delay: float) -> Callable[..., Any]:
    """``step``, ``delay`` seconds later."""

    def slow_step(*args: Any, **kw: Any) -> Any:
        time.sleep(delay)
        return step(*args, **kw)

    return slow_step


def slow_down() -> None:
    """Patch decoding steps and warm-up as ``SLOW_STEP_S`` and ``WARM_UP_GATE`` say (test-only, in this process)."""
    from service.runtime.runner import FORMS
    from service.serving.engine import Engine

    delay = float(os.environ.get("SLOW_STEP_S", "0"))
    gate = os.environ.get("WARM_UP_GATE")
    if delay:
        for form in FORMS.values():
            form.step = slowed(form.step, delay)  # type: ignore[method-assign]
    if gate:
        warm_up = Engine.warm_up

        def gated(self: Engine) -> None:
            while not Path(gate).exists():
                time.sleep(0.02)
            warm_up(self)

        Engine.warm_up = gated  # type: ignore[method-assign]


if __name__ == "__main__":
    slow_down()
    from service.cli.main import main

    sys.exit(main())
