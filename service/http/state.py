"""What the lifespan creates and the routes use: settings, the served models, metrics, admission, stored files."""

from __future__ import annotations

from fastapi import Request

from service.http.files import FileStore
from service.http.ratelimit import Admission
from service.metrics import Metrics
from service.serving.models import Models
from service.settings import Settings
from service.text.detect import Detector


class State:
    """The app's state (``app.state.attnserve``)."""

    def __init__(self, settings: Settings, metrics: Metrics, detector: Detector | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models = Models(settings, metrics, detector)  # pairs, routes, engines, readiness
        self.files = FileStore(settings.files_dir, settings.file_ttl_s)  # /translate_file's
        self.admission = Admission(settings)


def state_of(request: Request) -> State:
    """The app's :class:`State`, read directly rather than through a FastAPI dependency: resolving one costs the
    event loop time on every request, which the decoding thread then waits for (the GIL)."""
    state: State = request.app.state.attnserve
    return state
