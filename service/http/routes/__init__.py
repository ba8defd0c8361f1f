"""One router per resource, in the order the OpenAPI document lists them."""

from __future__ import annotations

from fastapi import APIRouter

from service.http.routes import (
    attention,
    detect,
    docs,
    explorer,
    files,
    frontend,
    languages,
    operations,
    suggest,
    translate,
)

ROUTERS: tuple[APIRouter, ...] = (
    translate.router,
    attention.router,
    files.router,
    languages.router,
    operations.router,
    explorer.router,
    detect.router,
    frontend.router,
    suggest.router,
    docs.router,
)
