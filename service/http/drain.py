"""Graceful shutdown's HTTP side: once draining begins (SIGTERM, service/cli/server.py), requests already accepted are
answered in full, new ones get 503 with ``Retry-After`` (``/readyz`` among them, so probes see it at once), and
those still unanswered at the drain's deadline get 503 too: an accepted request is never dropped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from service.http.errors import error
from service.http.middleware import ASGIApp, Message, Receive, Scope, Send

ALWAYS = frozenset({"/healthz", "/metrics"})  # alive and scraped while draining
EXIT_ALLOWANCE_S = 2.0  # taken off the shutdown timeout for the 503s, closing connections and stopping engines


class Shutdown:
    """The drain's state, shared by the middleware (the app) and the server (the signal).

    Args:
        timeout_s: from the signal to the process' exit (``ATTNSERVE_SHUTDOWN_TIMEOUT_S``); requests unanswered
            :data:`EXIT_ALLOWANCE_S` before it (at most a third of it) get 503.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.draining = False
        self.deadline = float("inf")
        self.expired: set[asyncio.Task[Any]] = set()  # tasks cancelled at the deadline, to answer 503
        self.in_flight: dict[asyncio.Task[Any], list[bool]] = {}  # request task -> [its response started]

    def begin(self) -> None:
        """Start draining (from a signal handler: it only sets fields)."""
        if not self.draining:
            self.deadline = time.monotonic() + self.timeout_s - min(EXIT_ALLOWANCE_S, self.timeout_s / 3)
            self.draining = True

    def drained(self) -> bool:
        """Called on the event loop while serving: whether the server may close now (draining, nothing in flight).

        Past the deadline it cancels every request whose answer has not started; each then answers 503.
        """
        if not self.draining:
            return False
        if not self.in_flight:
            return True
        if time.monotonic() >= self.deadline:
            for task, started in self.in_flight.items():
                if not started[0] and task not in self.expired:
                    self.expired.add(task)
                    task.cancel()
        return False


class Drain:
    """ASGI middleware: tracks the requests in flight and answers as :class:`Shutdown` says."""

    def __init__(self, app: ASGIApp, shutdown: Shutdown) -> None:
        self.app, self.shutdown = app, shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shutdown = self.shutdown
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if shutdown.draining and scope["path"] not in ALWAYS:
            await refuse(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        started = shutdown.in_flight[task] = [False]

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if task not in shutdown.expired:
                raise
            task.uncancel()
            if not started[0]:
                await refuse(scope, receive, send)
        finally:
            del shutdown.in_flight[task]
            shutdown.expired.discard(task)


async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
    """503: the server is shutting down; the client retries, on another instance where there is one."""
    response = error(503, "the server is shutting down; retry (another instance may answer)", {"Retry-After": "1"})
    response.headers["Connection"] = "close"
    await response(scope, receive, send)
