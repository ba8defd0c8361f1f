"""GET /: the attention explorer page (service/static/index.html)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Response
from fastapi.responses import FileResponse

from service.http.errors import error

router = APIRouter()
PAGE = Path(__file__).resolve().parents[2] / "static" / "index.html"


@router.get("/", include_in_schema=False)
async def explorer() -> Response:
    """The attention explorer page."""
    if not PAGE.exists():
        return error(404, "the explorer page is not built")
    return FileResponse(PAGE)
