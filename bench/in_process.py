"""attnserve without HTTP: the service's engines started as ``attnserve serve`` starts them (service/http/app.py's
``start``: settings from the environment, schedulers, metrics, warm-up), then closed-loop callers on the same event
loop, each translating the next text in turn with ``Engine.translate``, one text a call, as /translate does for
bench/overhead.py's HTTP clients. What HTTP costs a request is the difference between the two.

bench/overhead.py runs it pinned to the server's core on its work directory's texts (setup.json) and reads one line,
``RESULT {json}``: answers a second and the first translation of each text.

    python bench/in_process.py --work /tmp/ov_work --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

import uvloop

from service.metrics import Metrics
from service.runtime.bundle import load_bundle
from service.serving.engine import Engine
from service.serving.models import Models
from service.serving.translation import Options
from service.settings import Settings


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="holds setup.json: the bundle and the texts")
    ap.add_argument("--clients", type=int, default=32, help="closed-loop callers")
    ap.add_argument("--seconds", type=float, default=10, help="seconds of load after a warm-up")
    return ap.parse_args(argv)


async def closed_loop(engine: Engine, texts: list[str], clients: int, seconds: float) -> tuple[float, dict[int, str]]:
    """``clients`` loops, each translating the next text in turn and waiting for it, for ``seconds``: (answers/s,
    the first translation of each text)."""
    outputs: dict[int, str] = {}
    answered = turn = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal answered, turn
        while time.perf_counter() < stop:
            i, turn = turn % len(texts), turn + 1
            (translation,) = await engine.translate([texts[i]], Options())
            answered += 1
            outputs.setdefault(i, translation.text)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return answered / (time.perf_counter() - t0), outputs


async def measure(bundle_dir: Path, texts: list[str], clients: int, seconds: float) -> tuple[float, dict[int, str]]:
    """Start the bundle's engine as the server does, warm it up with the same load, then load it for ``seconds``."""
    settings = Settings()
    models = Models(settings, Metrics())
    await models.start([load_bundle(bundle_dir)])
    if not models.ready or models.registry is None:
        raise SystemExit(models.not_ready)
    (engine,) = models.registry.engines()
    try:
        await closed_loop(engine, texts, clients, min(2.0, seconds))
        return await closed_loop(engine, texts, clients, seconds)
    finally:
        await models.close()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    setup = json.loads((args.work / "setup.json").read_text())
    rate, outputs = uvloop.run(measure(Path(setup["bundle"]), setup["texts"], args.clients, args.seconds))
    print("RESULT " + json.dumps({"rate": rate, "outputs": outputs}, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
