"""What operators and their tools read: GET /healthz, /readyz and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from service.http.auth import bearer, matches
from service.http.errors import error
from service.http.schemas import ErrorResponse
from service.http.state import state_of

router = APIRouter()


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorResponse}})
async def readyz(request: Request) -> Response:
    """Ready: every bundle's manifest and files are checked, and the bundles loaded at start-up (``eager_models``)
    have decoded once; the others load on first use (503 while loading, after a start-up failure, and while
    draining on SIGTERM: service/http/drain.py answers then). ``models`` names every bundle, ``loaded`` those
    loaded now."""
    served = state_of(request).models
    if not served.ready:
        return error(503, served.not_ready, {"Retry-After": "1"})
    models, loaded = served.bundles()
    return JSONResponse({"status": "ready", "models": models, "loaded": loaded})


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """The Prometheus metrics; with ``metrics_token`` set, only for ``Authorization: Bearer <token>``."""
    state = state_of(request)
    token = state.settings.metrics_token
    if token:
        given = bearer(request)
        if given is None:
            return error(401, "/metrics needs 'Authorization: Bearer <token>'", {"WWW-Authenticate": "Bearer"})
        if not matches(given, token):
            return error(403, "wrong metrics token")
    return Response(state.metrics.render(), media_type=state.metrics.content_type)
