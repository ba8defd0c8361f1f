"""The lean request path of the busiest route: the endpoint takes the Request and returns its Response itself, the
body is validated once, straight from its bytes, and the answer written by orjson.

FastAPI's own route handler solves the endpoint's dependencies, and its JSON body goes through ``json.loads`` and
then pydantic: each costs the event loop time on every request, which the decoding thread then waits for (the GIL).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from service.http.body import FORM, MULTIPART, parse_body

M = TypeVar("M", bound=BaseModel)
Endpoint = Callable[[Request], Coroutine[Any, Any, Response]]


class LeanRoute(APIRoute):
    """An APIRoute whose endpoint is ``async (Request) -> Response``: it is called as it is (no dependencies, no
    response validation), while OpenAPI still describes the route from its declaration."""

    def get_route_handler(self) -> Endpoint:
        endpoint: Endpoint = self.endpoint
        return endpoint


async def json_body(request: Request, model: type[M]) -> M:
    """The request's fields as ``model``: a JSON body without a query string validated from its bytes in one pass;
    anything else, or a body that does not validate, by :func:`~service.http.body.parse_body`, which reads every
    form LibreTranslate's clients send and names what is wrong as it always has.

    Raises:
        MalformedBody, InvalidField: as :func:`~service.http.body.parse_body`.
    """
    if not request.scope["query_string"]:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != FORM and content_type != MULTIPART:
            raw = await request.body()  # kept by Starlette for parse_body below
            try:
                return model.model_validate_json(raw)
            except ValidationError:
                pass
    return await parse_body(request, model)


class OrjsonResponse(Response):
    """A JSON answer written by orjson (UTF-8, compact, like Starlette's JSONResponse)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
