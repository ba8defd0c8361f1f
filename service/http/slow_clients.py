"""Deadlines that close the connections of slow and idle clients, so that they cannot hold the server's sockets and
memory: for the request head (a connection protocol), for the body (ASGI middleware), and uvicorn's keep-alive.

- ``header_timeout_s``: a connection must send a whole request line and headers within it of opening, or of its
  previous response; otherwise it is closed (uvicorn has no such deadline: a connection that sends nothing, or one
  header byte at a time, would stay open for ever).
- ``body_timeout_s``: a request's whole body must arrive within it of its headers; otherwise it is answered 408
  with ``Connection: close``, and the app reads a disconnect.
- ``keep_alive_timeout_s``: uvicorn's ``timeout_keep_alive``, how long an idle connection waits for its next request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.http.middleware import ASGIApp, Message, Receive, Scope, Send
from service.metrics import Metrics
from service.settings import Settings


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request head (:func:`header_deadline` sets it)."""

    header_timeout_s = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        busy = self.cycle is not None and not self.cycle.response_complete  # a pipelined request being served
        if not busy and not self.transport.is_closing():
            self.transport.close()


def header_deadline(seconds: float) -> type[HeaderDeadline]:
    """The protocol class for uvicorn's ``http`` option, with a request-head deadline of ``seconds``."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout_s": seconds})


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` that carry the connection deadlines."""
    return {"timeout_keep_alive": settings.keep_alive_timeout_s, "http": header_deadline(settings.header_timeout_s)}


class BodyDeadline:
    """408 for a request whose body has not fully arrived ``seconds`` after its headers.

    One timer a request, cancelled when the last of the body arrives (no timer at all when the app reads no body).
    When it fires, the answer is sent from here with ``Connection: close``; uvicorn then closes the connection, the
    app's pending receive reads ``http.disconnect``, and whatever the app sends is dropped. So the answer does not
    depend on how the body is parsed.
    """

    def __init__(self, app: ASGIApp, seconds: float, metrics: Callable[[], Metrics | None]) -> None:
        self.app, self.seconds, self.metrics = app, seconds, metrics
        self.answer = JSONResponse(
            {"error": f"the request body did not arrive within body_timeout_s={seconds:g} s; send it faster"},
            status_code=408,
            headers={"Connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        refusal: asyncio.Task[None] | None = None
        reading, started = True, False

        def expire() -> None:
            nonlocal reading, refusal
            reading = False
            if not started:
                refusal = loop.create_task(self._refuse(scope, send))

        async def timed() -> Message:
            nonlocal timer, reading
            if reading and timer is None:
                timer = loop.call_later(self.seconds, expire)
            message = await receive()
            if reading and not (message["type"] == "http.request" and message.get("more_body", False)):
                reading = False
                timer.cancel()  # type: ignore[union-attr]
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if refusal is None:
                started = True
                await send(message)

        try:
            await self.app(scope, timed, guarded)
        finally:
            if timer is not None:
                timer.cancel()
            if refusal is not None:
                await refusal  # the answer is out before uvicorn sees the app return

    async def _refuse(self, scope: Scope, send: Send) -> None:
        if (m := self.metrics()) is not None:
            m.reject("slow_body")

        async def nothing() -> Message:
            return {"type": "http.disconnect"}

        await self.answer(scope, nothing, send)
