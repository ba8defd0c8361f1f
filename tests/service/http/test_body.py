"""Request fields from JSON, urlencoded and multipart bodies and the query string (service/http/body.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi import Request
from pydantic import BaseModel, ConfigDict

from service.http.body import parse_body
from service.http.errors import InvalidField, MalformedBody
from tests.service.conftest import Server


class Fields(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as the routes' models

    q: str | list[str]
    source: str = "auto"
    target: str
    beam_size: int | None = None
    layers: list[int] | None = None


def request(body: bytes = b"", content_type: str | None = None, query: str = "") -> Request:
    """A Starlette request as the server would hand it to a route."""
    headers = [] if content_type is None else [(b"content-type", content_type.encode())]
    scope = {"type": "http", "method": "POST", "path": "/translate", "query_string": query.encode(), "headers": headers}
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def parse(body: bytes = b"", content_type: str | None = None, query: str = "") -> Fields:
    return asyncio.run(parse_body(request(body, content_type, query), Fields))


def multipart(fields: dict[str, str], files: dict[str, tuple[str, bytes]]) -> tuple[bytes, str]:
    """A multipart body as httpx encodes it, with its content type."""
    built = httpx.Request("POST", "http://x/", data=fields, files=files)
    return built.read(), built.headers["content-type"]


FORM = "application/x-www-form-urlencoded"


@pytest.mark.parametrize("text", ["café", "Save as…", "ファイルを開く", "a+b & c=d"])
def test_urlencoded_forms_are_utf8_raw_or_percent_encoded(text: str) -> None:
    raw = f"q={text.replace('&', '%26').replace('+', '%2B').replace('=', '%3D')}&source=en&target=ja"
    assert parse(raw.encode("utf-8"), FORM).q == text  # as curl -d sends it
    encoded = httpx.QueryParams({"q": text, "source": "en", "target": "ja"})
    assert parse(str(encoded).encode("ascii"), FORM).q == text  # as requests and urllib send it


def test_a_form_that_is_not_utf8_is_a_malformed_body() -> None:
    with pytest.raises(MalformedBody, match="UTF-8"):
        parse("q=café&target=ja".encode("latin-1"), FORM)
    with pytest.raises(MalformedBody, match="UTF-8"):
        parse(b"q=caf%E9&target=ja", FORM)  # percent-encoded Latin-1


def test_query_string_fields_on_an_empty_body() -> None:
    """deep-translator's LibreTranslator: requests.post(url, params=...), no body, no content type."""
    got = parse(query=str(httpx.QueryParams({"q": "café", "source": "en", "target": "ja", "beam_size": "2"})))
    assert (got.q, got.source, got.target, got.beam_size) == ("café", "en", "ja", 2)


def test_body_fields_win_over_the_query_string() -> None:
    got = parse(json.dumps({"q": "from the body", "target": "ja"}).encode(), "application/json", "q=query&source=en")
    assert (got.q, got.source, got.target) == ("from the body", "en", "ja")
    got = parse(b"q=form&target=ja", FORM, "q=query")
    assert got.q == "form"


def test_repeated_and_list_fields() -> None:
    got = parse(b"q=one&q=two&target=ja&layers=1", FORM)
    assert got.q == ["one", "two"] and got.layers == [1]


def test_multipart_fields_are_utf8_and_file_parts_are_left_out() -> None:
    body, content_type = multipart({"q": "café", "target": "ja"}, {"file": ("a.txt", b"\xff\xfe not text")})
    got = parse(body, content_type)
    assert (got.q, got.target) == ("café", "ja")
    body, content_type = multipart({"target": "ja"}, {"q": ("q.txt", b"a file where a text should be")})
    with pytest.raises(InvalidField, match="q: Field required"):
        parse(body, content_type)


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b"", None, "JSON object"),
        (b"[1, 2]", "application/json", "JSON object"),
        (b"{not json", "application/json", "malformed JSON"),
        (b"--x\r\nbroken", "multipart/form-data", "malformed form"),
    ],
)
def test_malformed_bodies(body: bytes, content_type: str | None, message: str) -> None:
    with pytest.raises(MalformedBody, match=message):
        parse(body, content_type)


def test_a_missing_field_is_named() -> None:
    with pytest.raises(InvalidField, match="target: Field required"):
        parse(b"q=x", FORM)


def source_tokens(server: Server, **kw: Any) -> list[str]:
    with server.client() as c:
        r = c.post("/translate", **kw)
    assert r.status_code == 200, r.text
    tokens: list[str] = r.json()["details"]["source_tokens"]
    return tokens


def test_over_http_every_way_of_sending_fields_reads_the_same_text(server: Server) -> None:
    fields = {"q": "Save as… café", "source": "en", "target": "ja", "return_details": "true"}
    expected = source_tokens(server, json={**fields, "return_details": True})
    raw = "&".join(f"{k}={v}" for k, v in fields.items()).encode("utf-8")  # curl -d, unencoded
    assert source_tokens(server, content=raw, headers={"content-type": FORM}) == expected
    assert source_tokens(server, data=fields) == expected
    assert source_tokens(server, params=fields) == expected
    assert source_tokens(server, data=fields, files={"file": ("notes.txt", b"a file part")}) == expected
    with server.client() as c:
        only_file = c.post("/translate", files={"file": ("notes.txt", b"a file part")})
    assert only_file.status_code == 422 and "q" in only_file.json()["error"]


# A misspelled field is refused by name, whichever way it comes, on every route that reads fields.
MISSPELLED = [
    ("/translate", {"q": "Open file", "source": "en", "target": "ja", "beam_sise": "2"}, "beam_sise"),
    ("/attention", {"q": "Open file", "source": "en", "target": "ja", "kind": "cross"}, "kind"),
    ("/detect", {"q": "Open file", "langauge": "en"}, "langauge"),
]


@pytest.mark.parametrize(("path", "fields", "name"), MISSPELLED)
@pytest.mark.parametrize("way", ["json", "form", "multipart", "query"])
def test_an_unknown_field_is_a_422_that_names_it(server: Server, path: str, fields: dict, name: str, way: str) -> None:
    sent: dict[str, Any] = {
        "json": {"json": fields},
        "form": {"data": fields},
        "multipart": {"data": fields, "files": {"note": ("n.txt", b"file parts are not fields")}},
        "query": {"params": fields},
    }[way]
    with server.client() as c:
        r = c.post(path, **sent)
    assert r.status_code == 422, r.text
    message = r.json()["error"]
    assert f"{name}: unknown field" in message and "the fields are q, " in message


def test_an_unknown_field_of_a_file_upload_is_a_422_that_names_it(server: Server) -> None:
    file = {"file": ("a.txt", b"Open file")}
    with server.client() as c:
        in_form = c.post("/translate_file", files=file, data={"target": "ja", "sorce": "en"})
        in_query = c.post("/translate_file", files=file, data={"target": "ja"}, params={"apikey": "k"})
        text_only = c.post("/translate_file", files=file, data={"target": "ja", "format": "text"})
    for r, name in ((in_form, "sorce"), (in_query, "apikey"), (text_only, "format")):
        assert r.status_code == 422 and f"{name}: unknown field" in r.json()["error"], r.text
