"""The OpenAPI document: the request bodies that the routes parse themselves, and the error answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.http.schemas import AttentionRequest, DetectRequest, ErrorResponse, TranslateRequest

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in {
        400: "Malformed body or unknown language pair",
        403: "Missing or wrong API key",
        413: "A limit was exceeded",
        422: "Invalid field",
        503: "Overloaded: retry after Retry-After seconds",
        504: "Deadline passed",
        408: "The body did not arrive within body_timeout_s",
        429: "Over the client's requests or characters a minute: retry after Retry-After seconds",
    }.items()
}


def request_body(model: str, *content_types: str) -> dict[str, Any]:
    """A route's ``openapi_extra``: its body is the component ``model`` in each content type."""
    content = {kind: {"schema": {"$ref": f"#/components/schemas/{model}"}} for kind in content_types}
    return {"requestBody": {"content": content, "required": True}}


def openapi_with_request_bodies(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The routes parse their bodies themselves (JSON or form), so FastAPI does not list the request models:
    add them to the OpenAPI components that the routes' request bodies refer to."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            for model in (TranslateRequest, AttentionRequest, DetectRequest):
                schema["components"]["schemas"][model.__name__] = model.model_json_schema()
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
