"""GET /frontend/settings: what LibreTranslate's web frontend and its clients read about the server."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.formats import accepted
from service.http.routes.languages import LANGUAGE_NAMES
from service.http.schemas import FrontendSettings
from service.http.state import state_of

router = APIRouter()
AUTO = {"code": "auto", "name": "Auto Detect"}  # LibreTranslate's default source


@router.get("/frontend/settings", response_model=FrontendSettings)
async def frontend_settings(request: Request) -> dict[str, Any]:
    """Limits, keys, file formats and the default languages, in LibreTranslate's shape."""
    state = state_of(request)
    s = state.settings
    target = next(iter(state.models.served()))[1]  # the first served pair's target
    return {
        "charLimit": s.max_chars,
        "frontendTimeout": s.frontend_timeout_ms,
        "apiKeys": bool(s.api_keys),
        "keyRequired": bool(s.api_keys),
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": accepted(),
        "language": {"source": AUTO, "target": {"code": target, "name": LANGUAGE_NAMES.get(target, target)}},
    }
