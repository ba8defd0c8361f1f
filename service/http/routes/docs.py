"""GET /docs (Swagger UI) and /redoc (ReDoc), whose scripts and styles the service serves itself from
fastapi-offline's packaged copy: the pages work on networks that cannot reach a CDN."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import FileResponse, HTMLResponse, Response

from service.http.errors import error

router = APIRouter()
ASSETS = Path(fastapi_offline.__file__).parent / "static"
SERVED = ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png")  # nothing else is served
TITLE = "attnserve"


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI on /openapi.json."""
    root = _root(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{TITLE} — Swagger UI",
        swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/assets/favicon.png",
        oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
        swagger_ui_parameters={"validatorUrl": None},  # Swagger UI's default sends the spec to swagger.io
    )


@router.get("/docs/oauth2-redirect", include_in_schema=False)
async def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 redirect page."""
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", include_in_schema=False)
async def redoc(request: Request) -> HTMLResponse:
    """ReDoc on /openapi.json, without Google Fonts."""
    root = _root(request)
    return get_redoc_html(
        openapi_url=f"{root}/openapi.json",
        title=f"{TITLE} — ReDoc",
        redoc_js_url=f"{root}/docs/assets/redoc.standalone.js",
        redoc_favicon_url=f"{root}/docs/assets/favicon.png",
        with_google_fonts=False,
    )


@router.get("/docs/assets/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    """One of :data:`SERVED`; any other name is a 404 (so no path leaves the assets' directory)."""
    if name not in SERVED:
        return error(404, f"no such documentation asset: {name!r}")
    return FileResponse(ASSETS / name, headers={"Cache-Control": "public, max-age=86400"})
