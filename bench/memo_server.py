"""``attnserve serve`` without the cost of decoding, for bench/overhead.py's event-loop rows: each text is answered
at once with what the runner gave it the first time (a memo of the runner's results). Everything else a request
costs the event loop stays as the service runs it: HTTP, the middleware, the route, the text pipeline, the
tokenizer, the memory budget, the futures and the answer.

``--beside-decoding`` adds what decoding does to the event loop without its answers: a thread that decodes the first
28 requests it has answered, in batches, again and again, on the same core (the process is pinned by the caller).

    python bench/memo_server.py [--beside-decoding] serve --bundle BUNDLE --port PORT
"""

from __future__ import annotations

import asyncio
import sys
import threading
from dataclasses import replace

from service.decoding import DecodeRequest, DecodeResult, StepRunner, decode
from service.serving.scheduler import Scheduler

BATCH = 28  # requests a batch of the decoding loop beside the server: about the rows of a step under bench/overhead.py


class Memo:
    """The runner's result for each distinct request, computed on the event loop the first time it is asked for."""

    def __init__(self, beside_decoding: bool) -> None:
        self.results: dict[str, tuple[DecodeRequest, DecodeResult]] = {}  # by the request's repr, in order
        self.beside_decoding = beside_decoding
        self.decoding: threading.Thread | None = None
        self.stopping = threading.Event()

    def submit_many(
        self,
        scheduler: Scheduler,
        requests: list[DecodeRequest],
        timeout: float,
        arrival: float | None = None,
        pair: str = "",
    ) -> list[asyncio.Future[DecodeResult]]:
        """:meth:`Scheduler.submit_many`'s contract: futures that the event loop sets on its next turn."""
        loop = asyncio.get_running_loop()
        runner: StepRunner = scheduler.decoder.runner  # type: ignore[attr-defined]
        futures = []
        for request in requests:
            # a text's constraint is made anew for each request (its repr names the object), and is the same one
            key = repr(replace(request, constraint=None)) + repr(request.constraint is not None)
            if key not in self.results:
                self.results[key] = request, decode(runner, [request])[0]
            future: asyncio.Future[DecodeResult] = loop.create_future()
            loop.call_soon(future.set_result, self.results[key][1])
            futures.append(future)
        if self.beside_decoding and self.decoding is None and len(self.results) >= BATCH:
            self.decoding = threading.Thread(target=self.decode_forever, args=(runner,), daemon=True)
            self.decoding.start()
        return futures

    def decode_forever(self, runner: StepRunner) -> None:
        """Until :meth:`stop` (the server: until it exits)."""
        batch = [request for request, _ in list(self.results.values())[:BATCH]]
        while not self.stopping.is_set():
            decode(runner, batch)

    def stop(self) -> None:
        self.stopping.set()
        if self.decoding is not None:
            self.decoding.join()


def main(argv: list[str]) -> int:
    memo = Memo(beside_decoding="--beside-decoding" in argv)
    Scheduler.submit_many = lambda self, *args, **kwargs: memo.submit_many(self, *args, **kwargs)  # type: ignore[method-assign]
    from service.cli.main import main as attnserve

    try:
        return attnserve([a for a in argv if a != "--beside-decoding"])
    finally:
        memo.stop()  # a daemon thread still in ONNX Runtime as the interpreter exits aborts the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
