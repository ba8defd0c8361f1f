"""Deadlines that close the connections of slow and idle clients, so that they cannot hold the server's sockets and
memory: for the request head (a connection protocol), for the body (ASGI middleware), and uvicorn's keep-alive.

- ``header_timeout_s``: a connection must send a whole request line and headers within it of opening, or of its
  previous response; otherwise it is closed (uvicorn has no such deadline: a connection that sends nothing, or one
  header byte at a time, would stay open for ever).
- ``max_header_bytes``: a request head still incomplete after that many bytes is answered 431 and the connection
  closed (httptools, unlike h11, takes heads of any size; a head that completes within one read of the socket is
  let through, so a connection holds at most this or one read); each counts in
  ``rejected_total{reason="header_too_large"}``.
- ``body_timeout_s``: a request's whole body must arrive within it of its headers; otherwise it is answered 408
  with ``Connection: close``, and the app reads a disconnect.
- ``keep_alive_timeout_s``: uvicorn's ``timeout_keep_alive``, how long an idle connection waits for its next request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.http.middleware import ASGIApp, Message, Receive, Scope, Send
from service.metrics import Metrics
from service.settings import Settings


class HeaderDeadline(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request head (:func:`header_deadline`
    sets them): httptools itself takes headers of any size."""

    header_timeout_s = 10.0
    max_header_bytes = 65536
    _header_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0

    @staticmethod
    def metrics() -> Metrics | None:
        """Where the refused heads count (:func:`header_deadline` sets it; None: not counted)."""
        return None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is None:
            return
        self._head_bytes += len(data)  # all of it is head: the head is still not complete
        if self._head_bytes > self.max_header_bytes and not self.transport.is_closing():
            if (m := self.metrics()) is not None:
                m.reject("header_too_large")
            if not self._busy():
                self.transport.write(_too_large_head(self.max_header_bytes))
            self.transport.close()

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
        self._head_bytes = 0
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete  # a pipelined request being served

    def _expire(self) -> None:
        self._header_timer = None
        if not self._busy() and not self.transport.is_closing():
            self.transport.close()


def _too_large_head(limit: int) -> bytes:
    body = json.dumps({"error": f"the request line and headers are over max_header_bytes={limit}"}).encode()
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    return f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body


def header_deadline(
    seconds: float,
    max_bytes: int = HeaderDeadline.max_header_bytes,
    metrics: Callable[[], Metrics | None] = HeaderDeadline.metrics,
) -> type[HeaderDeadline]:
    """The protocol class for uvicorn's ``http`` option, with a request-head deadline of ``seconds`` and a head of
    at most ``max_bytes``; ``metrics`` gives where the 431s count, once there is one."""
    attributes = {"header_timeout_s": seconds, "max_header_bytes": max_bytes, "metrics": staticmethod(metrics)}
    return type("HeaderDeadline", (HeaderDeadline,), attributes)


def uvicorn_options(settings: Settings, app: FastAPI) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` that carry the connection deadlines, for
    ``app`` (:func:`service.http.app.create_app`'s, whose metrics count the refused heads)."""

    def metrics() -> Metrics | None:
        state = getattr(app.state, "attnserve", None)  # the lifespan sets it, before the server listens
        return state.metrics if state is not None else None

    protocol = header_deadline(settings.header_timeout_s, settings.max_header_bytes, metrics)
    return {"timeout_keep_alive": settings.keep_alive_timeout_s, "http": protocol}


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
