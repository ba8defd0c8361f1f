"""Request fields into a pydantic model, from wherever LibreTranslate's clients put them: a JSON object, a
urlencoded or multipart form, and the query string (deep-translator sends its fields there, on a POST with an empty
body). Fields of the body win over the query string's; a field the model does not have is refused by name."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.http.errors import InvalidField, MalformedBody, validation_message

M = TypeVar("M", bound=BaseModel)
LISTS = ("layers", "heads", "kinds")  # form fields that are lists even when given once
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"


async def parse_body(request: Request, model: type[M]) -> M:
    """The request's fields as ``model``.

    File parts of a multipart body are left out; the route that wants them reads ``await request.form()``, which
    Starlette keeps from this parse.

    Raises:
        MalformedBody: the body is not valid JSON, a JSON object, or form data, and the query string has no fields.
        InvalidField: a field is missing or invalid.
    """
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    query = _fields(parse_qsl(request.url.query, keep_blank_values=True)) if request.scope["query_string"] else {}
    data: dict[str, Any]
    if content_type == FORM:
        data = _fields(_urlencoded(await request.body()))
    elif content_type == MULTIPART:
        data = await _multipart(request)
    else:
        data = _json(await request.body(), bool(query))
    try:
        return model.model_validate({**query, **data} if query else data)
    except ValidationError as e:
        raise InvalidField(validation_message(e.errors(), list(model.model_fields))) from e


def check_fields(names: Iterable[str], fields: Sequence[str]) -> None:
    """Refuse a request that names a field outside ``fields`` (a route that reads its fields itself).

    Raises:
        InvalidField: naming each unknown field, then the fields there are.
    """
    unknown = [n for n in dict.fromkeys(names) if n not in fields]
    if unknown:
        named = "; ".join(f"{n}: unknown field" for n in unknown)
        raise InvalidField(f"invalid request: {named}; the fields are {', '.join(fields)}")


def _fields(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Form pairs as fields: a name given once is a string, given more than once (or in :data:`LISTS`) a list."""
    values: dict[str, list[str]] = {}
    for key, value in pairs:
        values.setdefault(key, []).append(value)
    return {k: v if len(v) > 1 or k in LISTS else v[0] for k, v in values.items()}


def _urlencoded(raw: bytes) -> list[tuple[str, str]]:
    """A urlencoded body's pairs, read as UTF-8: clients send raw UTF-8 (``curl -d 'q=café'``) as well as
    percent-encoded UTF-8, and Starlette's form parser reads the raw kind as Latin-1."""
    try:
        return parse_qsl(raw.decode("utf-8"), keep_blank_values=True, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise MalformedBody(f"malformed form body: not UTF-8 ({e}); send form fields encoded as UTF-8") from e


async def _multipart(request: Request) -> dict[str, Any]:
    try:
        form = await request.form()
    except Exception as e:  # python-multipart's errors are not part of its API
        raise MalformedBody(f"malformed form body: {e}") from e
    return _fields([(key, value) for key, value in form.multi_items() if isinstance(value, str)])


def _json(raw: bytes, has_query: bool) -> dict[str, Any]:
    """A JSON body's object; an empty body is no fields when the query string has some."""
    if not raw and has_query:
        return {}
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError) as e:  # bad syntax or UTF-8, an integer too long, nesting too deep
        raise MalformedBody(f"malformed JSON body: {e}; send a JSON object or form fields") from e
    if not isinstance(data, dict):
        raise MalformedBody("the body must be a JSON object (or form fields, or query-string parameters)")
    return data
