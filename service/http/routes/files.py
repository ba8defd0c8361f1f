"""POST /translate_file and GET /download_file/<name>: a file translated as its extension says (service/formats),
kept for download until it expires (service/http/files.py), as LibreTranslate answers them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from starlette.datastructures import FormData, UploadFile

from service.errors import TooLarge
from service.formats import accepted, format_for
from service.formats.base import Translate, batched
from service.http.body import check_fields
from service.http.errors import InvalidField, MalformedBody, UnsupportedFormat
from service.http.middleware import count_under
from service.http.openapi import ERRORS
from service.http.schemas import TranslateFileResponse
from service.http.state import state_of
from service.serving.route import Route
from service.serving.translation import Options

router = APIRouter()

# The form's fields, as LibreTranslate's frontend sends them; any other is a 422.
FIELDS: dict[str, Any] = {
    "file": {"type": "string", "format": "binary", "description": "The file (.po, .txt, ...)."},
    "source": {"type": "string", "default": "auto", "example": "en"},
    "target": {"type": "string", "example": "ja"},
    "api_key": {"type": "string", "description": "API key, when the server requires one."},
    "secret": {"type": "string", "description": "LibreTranslate's frontend sends it with its key; not used."},
}
UPLOAD = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "target"],
                    "properties": FIELDS,
                    "additionalProperties": False,
                }
            }
        },
    }
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {**ERRORS[400], "description": "No such file, or it expired"}}


async def read_form(request: Request) -> FormData:
    """The multipart body (one file at most).

    Raises:
        MalformedBody: it is not valid multipart data.
    """
    try:
        return await request.form(max_files=1)
    except TooLarge:  # the body limit, while the body streams in
        raise
    except Exception as e:  # python-multipart's errors are not part of its API
        raise MalformedBody(f"malformed multipart body: {e}; send the file as a multipart part named 'file'") from e


def route_translator(route: Route, size: int) -> Translate:
    """The pair's greedy translations, ``size`` texts a batch."""

    async def call(texts: list[str]) -> list[str]:
        return [t.text for t in await route.translate(texts, Options())]

    return batched(call, size)


class Charged:
    """A file's translator that charges the client for the texts it is given before any is decoded: the file
    counts one request, and its texts' characters toward ``chars_per_request`` and ``chars_per_minute``.

    Args:
        translate: the translator.
        charge: (requests, characters) → None, or raises the refusal (:meth:`Admission.charge`).
    """

    def __init__(self, translate: Translate, charge: Callable[[int, int], None]) -> None:
        self.translate, self.charge, self.requests = translate, charge, 1

    async def __call__(self, texts: list[str]) -> list[str | None]:
        self.charge(self.requests, sum(len(t) for t in texts))
        self.requests = 0
        return await self.translate(texts)

    def settle(self) -> None:
        """Charge the one request of a file that had nothing to translate."""
        if self.requests:
            self.charge(self.requests, 0)
            self.requests = 0


@router.post("/translate_file", response_model=TranslateFileResponse, responses=ERRORS, openapi_extra=UPLOAD)
async def translate_file(request: Request) -> JSONResponse:
    """Translate a file (LibreTranslate-compatible); the answer says where to download the translation."""
    form = await read_form(request)
    try:
        return await translate_upload(request, form)
    finally:
        await form.close()  # the upload's spooled temporary file


async def translate_upload(request: Request, form: FormData) -> JSONResponse:
    """The upload in ``form`` translated and stored: the answer of :func:`translate_file`."""
    state = state_of(request)
    settings = state.settings
    check_fields([*form.keys(), *request.query_params.keys()], list(FIELDS))

    def field(name: str) -> str | None:
        value = form.get(name)
        return value if isinstance(value, str) and value else request.query_params.get(name)

    client = state.admission.client(request, field("api_key"))  # charged once its texts are known
    upload = form.get("file")
    if not isinstance(upload, UploadFile) or not upload.filename:
        raise InvalidField("file: missing; send the file as a multipart part named 'file', with its file name")
    file_format = format_for(upload.filename)
    if file_format is None:
        raise UnsupportedFormat(f"file {upload.filename!r}: its format is not accepted; send {', '.join(accepted())}")
    target = field("target")
    if not target:
        raise InvalidField("target: missing; send the target language code, as GET /languages lists it")
    route = state.models.route(field("source") or "auto", target)
    count_under(request, route.pair)
    data = await upload.read(settings.max_file_bytes + 1)
    if len(data) > settings.max_file_bytes:
        limit = settings.max_file_bytes
        raise TooLarge(f"file: over the limit max_file_bytes={limit}", "max_file_bytes", limit)
    if not data:
        raise InvalidField("file: it is empty")
    translator = Charged(route_translator(route, settings.max_texts), partial(state.admission.charge, client))
    translated = await file_format.translate(data, translator, target)
    translator.settle()
    name = await asyncio.to_thread(state.files.save, translated, upload.filename)
    return JSONResponse({"translatedFileUrl": str(request.url_for("download_file", name=name))})


@router.get("/download_file/{name}", response_class=FileResponse, responses=NOT_FOUND)
async def download_file(request: Request, name: str) -> FileResponse:
    """A translated file, as an attachment named as the upload was, until it expires."""
    stored = await asyncio.to_thread(state_of(request).files.open, name)
    file_format = format_for(stored.download_name)
    media_type = file_format.media_type if file_format else "application/octet-stream"
    return FileResponse(stored.path, media_type=media_type, filename=stored.download_name)
