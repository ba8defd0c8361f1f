"""One router per resource, in the order the OpenAPI document lists them."""

from __future__ import annotations

from fastapi import APIRouter

from service.http.routes import attention, explorer, files, languages, operations, translate

ROUTERS: tuple[APIRouter, ...] = (
    translate.router,
    attention.router,
    files.router,
    languages.router,
    operations.router,
    explorer.router,
)
