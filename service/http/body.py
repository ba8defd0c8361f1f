"""Request bodies, JSON or form-encoded (LibreTranslate clients send both), into a pydantic model."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.http.errors import InvalidField, MalformedBody, validation_message

M = TypeVar("M", bound=BaseModel)
LISTS = ("layers", "heads", "kinds")  # form fields that are lists even when given once


async def parse_body(request: Request, model: type[M]) -> M:
    """The request's body as ``model``.

    Raises:
        MalformedBody: the body is not valid JSON, a JSON object, or form data.
        InvalidField: a field is missing or invalid.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    data: Any
    if content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        try:
            form = await request.form()
        except Exception as e:  # python-multipart's errors are not part of its API
            raise MalformedBody(f"malformed form body: {e}") from e
        data = {}
        for key in form:
            values = [v for v in form.getlist(key) if isinstance(v, str)]
            if values:  # a field sent only as a file is no text: it counts as missing
                data[key] = values if len(values) > 1 or key in LISTS else values[0]
    else:
        raw = await request.body()
        try:
            data = json.loads(raw) if raw else None
        except (ValueError, RecursionError) as e:  # bad syntax or UTF-8, an integer too long, nesting too deep
            raise MalformedBody(f"malformed JSON body: {e}; send a JSON object or form fields") from e
        if not isinstance(data, dict):
            raise MalformedBody("the body must be a JSON object (or form fields)")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InvalidField(validation_message(e.errors())) from e
