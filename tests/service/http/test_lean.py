"""/translate's lean path (service/http/lean.py): a JSON body validated from its bytes reads as parse_body reads it,
and everything else, errors included, is parse_body's."""

from __future__ import annotations

import asyncio

import pytest

from service.http.errors import InvalidField, MalformedBody
from service.http.lean import json_body
from tests.service.conftest import Server
from tests.service.http.test_body import FORM, Fields, parse, request

BODIES = [
    (b'{"q": "Save as\\u2026 caf\\u00e9", "target": "ja"}', "application/json"),
    ('{"q": ["ファイルを開く", "x"], "target": "ja", "beam_size": "2"}'.encode(), None),
    (b'{"q": "x", "target": "ja", "beam_size": 2.0}', "text/plain"),
    (b'{"q": "first", "q": "second", "target": "ja"}', "application/json; charset=utf-8"),
    (b"q=x&target=ja", FORM),
]


def lean(body: bytes, content_type: str | None = None, query: str = "") -> Fields:
    return asyncio.run(json_body(request(body, content_type, query), Fields))


@pytest.mark.parametrize(("body", "content_type"), BODIES)
def test_a_body_reads_as_parse_body_reads_it(body: bytes, content_type: str | None) -> None:
    assert lean(body, content_type) == parse(body, content_type)


def test_query_string_fields_still_merge() -> None:
    assert lean(b'{"q": "x"}', "application/json", "target=ja").target == "ja"
    assert lean(b"", None, "q=x&target=ja") == parse(b"", None, "q=x&target=ja")


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b"", MalformedBody, "JSON object"),
        (b"[1, 2]", MalformedBody, "JSON object"),
        (b"{not json", MalformedBody, "malformed JSON"),
        (b'{"q": "x"}', InvalidField, "target: Field required"),
        (b'{"q": 3, "target": "ja"}', InvalidField, "q"),
        (b'{"q": "x", "target": "ja", "extra": [1]}', InvalidField, "extra: unknown field; the fields are q, "),
    ],
)
def test_errors_are_parse_bodys(body: bytes, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        lean(body, "application/json")


@pytest.mark.parametrize("source", ["en", "auto"])
def test_an_unpaired_surrogate_is_refused_by_name(server: Server, source: str) -> None:
    body = b'{"q": ["ok", "a\\ud800b"], "target": "ja", "source": "%s"}' % source.encode()
    with server.client() as c:
        r = c.post("/translate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "unpaired surrogate" in r.json()["error"], r.text
