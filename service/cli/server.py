"""uvicorn's server as ``attnserve serve`` runs it: SIGTERM (or Ctrl-C) drains (service/http/drain.py) before
uvicorn's own shutdown, and a start-up failure after listening ends the process with code 2."""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn

from service.http.drain import Shutdown

log = logging.getLogger("attnserve")


class Server(uvicorn.Server):
    """A uvicorn server that drains on the first SIGTERM or SIGINT; a second one is uvicorn's (Ctrl-C twice
    forces the exit).

    Attributes:
        exit_code: 0, or 2 once :meth:`fail` was called.
    """

    def __init__(self, config: uvicorn.Config, shutdown: Shutdown) -> None:
        super().__init__(config)
        self.drain = shutdown
        self.exit_code = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or sig not in (signal.SIGTERM, signal.SIGINT):
            super().handle_exit(sig, frame)
            return
        self.drain.begin()  # not a captured signal: uvicorn would raise it again at exit, ending with its code

    async def on_tick(self, counter: int) -> bool:
        exit_now = await super().on_tick(counter)
        if self.drain.draining and counter % 10 == 0:
            log.info("draining: %d requests in flight", len(self.drain.in_flight))
        return exit_now or self.drain.drained()

    def fail(self, message: str) -> None:
        """Stop serving: start-up failed after the server began to listen (``message`` is already logged)."""
        self.exit_code = 2
        self.should_exit = True
