"""What the lifespan creates and the routes use: settings, engines by language pair, metrics, readiness."""

from __future__ import annotations

from fastapi import Request

from service.errors import AmbiguousSource, NotReady, UnknownPair
from service.http.files import FileStore
from service.http.ratelimit import Admission
from service.metrics import Metrics
from service.serving.engine import Engine
from service.settings import Settings
from service.text.detect import Detector


class State:
    """The app's state (``app.state.attnserve``)."""

    def __init__(
        self, settings: Settings, engines: list[Engine], metrics: Metrics, detector: Detector | None = None
    ) -> None:
        self.settings = settings
        self.engines = {e.pair: e for e in engines}
        self.metrics = metrics
        self.detector = detector or Detector()  # /detect and source "auto"
        self.ready = False
        self.files = FileStore(settings.files_dir, settings.file_ttl_s)  # /translate_file's
        self.not_ready = "loading the models"  # why not ready, for /readyz and 503s
        self.admission = Admission(settings)

    def served(self) -> dict[tuple[str, str], Engine]:
        """The engines by language pair, once every one is loaded and warm.

        Raises:
            NotReady: the engines are still loading (or failed to): which pairs are served is not known yet.
        """
        if not self.ready:
            raise NotReady(f"the server is not ready ({self.not_ready}); retry shortly")
        return self.engines

    def engine(self, source: str, target: str) -> tuple[Engine, bool]:
        """The engine for a pair; ``source="auto"`` picks the only pair with that target. Returns (engine, auto).

        Raises:
            UnknownPair: no engine serves the pair.
            AmbiguousSource: ``source="auto"`` and several pairs translate into ``target``.
            NotReady: the engines are still loading (or failed to).
        """
        engines = self.served()
        if source == "auto":
            found = [e for (_, t), e in engines.items() if t == target]
            if len(found) == 1:
                return found[0], True
            if found:
                raise AmbiguousSource(f"several pairs translate into {target!r}; set 'source' explicitly")
        elif (source, target) in engines:
            return engines[(source, target)], False
        pairs = ", ".join(f"{s}→{t}" for s, t in engines)
        raise UnknownPair(f"no model translates {source}→{target}; this server serves {pairs} (GET /languages)")


def state_of(request: Request) -> State:
    """The app's :class:`State`, read directly rather than through a FastAPI dependency: resolving one costs the
    event loop time on every request, which the decoding thread then waits for (the GIL)."""
    state: State = request.app.state.attnserve
    return state
