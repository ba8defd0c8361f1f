"""POST /suggest: LibreTranslate's answer when suggestions are off, as they always are here."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.http.errors import error
from service.http.schemas import ErrorResponse

router = APIRouter()


@router.post("/suggest", responses={403: {"model": ErrorResponse}})
async def suggest() -> JSONResponse:
    """Refuse a suggested translation: this server takes none (``/frontend/settings`` says ``suggestions: false``)."""
    return error(403, "Suggestions are disabled on this server.")
