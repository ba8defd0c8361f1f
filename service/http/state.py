"""What the lifespan creates and the routes use: settings, the served pairs (routes), metrics, readiness."""

from __future__ import annotations

from fastapi import Request

from service.errors import AmbiguousSource, NotReady, UnknownPair
from service.http.files import FileStore
from service.http.ratelimit import Admission
from service.metrics import Metrics
from service.serving.catalog import Pair, pivots
from service.serving.engine import Engine
from service.serving.pairs import PairRegistry
from service.serving.pivot import PivotRoute
from service.serving.route import Direct, Route
from service.settings import Settings
from service.text.detect import Detector
from service.text.glossary import read_glossary


class State:
    """The app's state (``app.state.attnserve``)."""

    def __init__(self, settings: Settings, metrics: Metrics, detector: Detector | None = None) -> None:
        self.settings = settings
        self.pairs: PairRegistry[Engine] | None = None  # the bundles behind the pairs, once registered
        self.routes: dict[Pair, Route] = {}  # every served pair: direct ones, then those through the pivot language
        self.metrics = metrics
        self.detector = detector or Detector()  # /detect and source "auto"
        self.ready = False
        self.files = FileStore(settings.files_dir, settings.file_ttl_s)  # /translate_file's
        self.not_ready = "loading the models"  # why not ready, for /readyz and 503s
        self.admission = Admission(settings)

    def serve(self, registry: PairRegistry[Engine]) -> None:
        """Serve ``registry``'s pairs, and through ``pivot_language`` the pairs no bundle serves where both hops
        are served.

        Raises:
            BundleError: a pivot pair's glossary file is malformed.
        """
        self.pairs = registry
        direct: dict[Pair, Route] = {pair: Direct(registry, pair) for pair in registry.pairs}
        s = self.settings
        routes = dict(direct)
        for p in pivots(direct, s.pivot_language):
            first, second = p.hops
            glossary = read_glossary(s.glossary_dir, *p.pair)
            decoding = s.pair_defaults.get("-".join(p.pair))
            routes[p.pair] = PivotRoute(p, direct[first], direct[second], glossary, decoding)
        self.routes = routes

    def served(self) -> dict[Pair, Route]:
        """Every served pair's route, once the server is ready (the eager bundles loaded and warm).

        Raises:
            NotReady: the bundles are still loading (or failed to): which pairs are served is not known yet.
        """
        if not self.ready:
            raise NotReady(f"the server is not ready ({self.not_ready}); retry shortly")
        return self.routes

    def route(self, source: str, target: str) -> tuple[Route, bool]:
        """The route of a pair; ``source="auto"`` picks the only pair with that target. Returns (route, auto).

        Raises:
            UnknownPair: no route serves the pair.
            AmbiguousSource: ``source="auto"`` and several pairs translate into ``target``.
            NotReady: the bundles are still loading (or failed to).
        """
        routes = self.served()
        if source == "auto":
            found = [r for (_, t), r in routes.items() if t == target]
            if len(found) == 1:
                return found[0], True
            if found:
                raise AmbiguousSource(f"several pairs translate into {target!r}; set 'source' explicitly")
        elif (source, target) in routes:
            return routes[(source, target)], False
        pairs = ", ".join(f"{s}→{t}" for s, t in routes)
        raise UnknownPair(f"no model translates {source}→{target}; this server serves {pairs} (GET /languages)")


def state_of(request: Request) -> State:
    """The app's :class:`State`, read directly rather than through a FastAPI dependency: resolving one costs the
    event loop time on every request, which the decoding thread then waits for (the GIL)."""
    state: State = request.app.state.attnserve
    return state
