"""Hostile and careless input against a real ``attnserve serve`` process, over raw sockets where a client library
would refuse to send it: no answer is ever a 5xx, the server logs no traceback, and a normal request gets the
same answer before and after. Input the tokenizer cannot take is a 400 that names the field."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.process import ServeProcess

NORMAL = {"q": "Open file", "source": "en", "target": "ja"}
ATTENTION = {**NORMAL, "kinds": ["cross"]}
statuses: list[tuple[str, int | None]] = []  # every answer of this module: (case, status or None if closed)


@pytest.fixture(scope="module")
def server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    log = tmp_path_factory.mktemp("hostile") / "log"
    with ServeProcess(log, bundles=tiny_bundle, max_wait_ms=1) as s:
        s.wait_ready()
        s.before = normal_answers(s)  # type: ignore[attr-defined]
        yield s


def normal_answers(server: ServeProcess) -> tuple[Any, Any]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        return c.post("/translate", json=NORMAL).json(), c.post("/attention", json=ATTENTION).json()


def exchange(port: int, data: bytes, half_close: bool = False, timeout: float = 10) -> tuple[int | None, bytes]:
    """Send raw bytes; the answer's status (None when the server closed without one) and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                head, sep, body = received.partition(b"\r\n\r\n")
                length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                if sep and length and len(body) >= int(length[0].split(b":")[1]):
                    break
        except TimeoutError:
            pass
    if not received:
        return None, b""
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def request(path: str, body: bytes, content_type: str = "application/json", headers: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"{headers}Connection: close\r\n\r\n"
    ).encode() + body


def raw(server: ServeProcess, case: str, data: bytes, half_close: bool = False) -> tuple[int | None, bytes]:
    status, body = exchange(server.port, data, half_close)
    statuses.append((case, status))
    assert status is None or status < 500, f"{case}: {status} {body[:300]!r}"
    return status, body


def post(server: ServeProcess, case: str, path: str, body: bytes, **kw: Any) -> tuple[int | None, Any]:
    status, answer = raw(server, case, request(path, body, **kw))
    return status, json.loads(answer) if answer else None


def test_unpaired_surrogates_are_400_naming_the_field(server: ServeProcess) -> None:
    for path, field, body in (
        ("/translate", "q", b'{"q": "\\ud800", "source": "en", "target": "ja"}'),
        ("/translate", "q", b'{"q": ["Open", "file \\udfff"], "source": "en", "target": "ja"}'),
        ("/attention", "q", b'{"q": "a\\udbff", "source": "en", "target": "ja"}'),
        ("/attention", "target_text", b'{"q": "Open", "source": "en", "target": "ja", "target_text": "\\ud800x"}'),
    ):
        status, answer = post(server, f"surrogate in {field}", path, body)
        assert status == 400 and answer["error"].startswith(f"{field}: "), answer
        assert "unpaired surrogate" in answer["error"]
    for body in (b'{"q": "x", "source": "\\ud800", "target": "ja"}', b'{"q": "x", "target": "\\udfff"}'):
        status, answer = post(server, "surrogate in a language", "/translate", body)
        assert status == 400 and "no model translates" in answer["error"]  # the refusal echoes it, escaped
    status, _ = post(server, "paired surrogates", "/translate", b'{"q": "\\ud83d\\ude00 file", "target": "ja"}')
    assert status == 200


def test_nul_and_invalid_utf8(server: ServeProcess) -> None:
    assert post(server, "NUL", "/translate", b'{"q": "a\\u0000b", "target": "ja"}')[0] == 200
    assert post(server, "raw NUL", "/translate", b'{"q": "a\x00b", "target": "ja"}')[0] == 400  # JSON forbids it
    status, answer = post(server, "invalid UTF-8", "/translate", b'{"q": "\xff\xfe\xc3", "target": "ja"}')
    assert status == 400 and "malformed JSON body" in answer["error"]
    assert post(server, "invalid UTF-8 form", "/translate", b"q=\xff\xfe&target=ja", content_type=FORM)[0] < 500
    assert post(server, "percent-encoded bytes", "/translate", b"q=%FF%FE%00&target=ja", content_type=FORM)[0] < 500
    status, _ = raw(server, "invalid UTF-8 in the path", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status is not None and 400 <= status < 500


FORM = "application/x-www-form-urlencoded"


def test_bodies_that_lie_or_stop(server: ServeProcess) -> None:
    body = json.dumps(NORMAL).encode()
    head = "POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    longer = f"{head}Content-Length: {len(body) + 100}\r\n\r\n".encode() + body
    assert raw(server, "Content-Length longer than the body", longer, half_close=True)[0] is None
    shorter = f"{head}Content-Length: {len(body) - 5}\r\n\r\n".encode() + body
    assert raw(server, "Content-Length shorter than the body", shorter)[0] in (400, None)
    assert raw(server, "Content-Length not a number", f"{head}Content-Length: ten\r\n\r\n".encode())[0] == 400
    assert raw(server, "negative Content-Length", f"{head}Content-Length: -1\r\n\r\n".encode())[0] == 400
    chunked = f"{head}Transfer-Encoding: chunked\r\n\r\n".encode()
    assert raw(server, "truncated chunked body", chunked + b"10\r\n" + body[:8], half_close=True)[0] is None
    assert (
        raw(server, "chunked body without its end", chunked + b"5\r\n" + body[:5] + b"\r\n", half_close=True)[0] is None
    )
    assert raw(server, "bad chunk size", chunked + b"zz\r\n" + body + b"\r\n0\r\n\r\n")[0] == 400
    assert (
        raw(server, "both lengths", f"{head}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n".encode())[0] == 400
    )
    full = chunked + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    assert raw(server, "chunked body", full)[0] == 200


def test_long_url_and_headers(server: ServeProcess) -> None:
    status, _ = raw(server, "20 kB URL", f"GET /languages?x={'a' * 20_000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status is not None and status < 500
    status, _ = raw(server, "20 kB path", f"GET /{'a' * 20_000} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert status == 404
    big_header = f"X-Big: {'b' * 20_000}\r\n"
    assert post(server, "20 kB header", "/translate", json.dumps(NORMAL).encode(), headers=big_header)[0] == 200


def test_deep_nesting_and_huge_numbers(server: ServeProcess) -> None:
    for path in ("/translate", "/attention"):
        for deep in (b"[" * 100_000 + b"]" * 100_000, b'{"q": ' + b"[" * 100_000, b'{"a":' * 50_000 + b"1"):
            status, answer = post(server, "nested 100,000 deep", path, deep)
            assert status == 400 and "malformed JSON body" in answer["error"]
        q = b'{"q": ' + b"[" * 500 + b'"x"' + b"]" * 500 + b', "target": "ja"}'
        assert post(server, "nested 500 deep in q", path, q)[0] == 422
    huge = b"9" * 5_000
    for field in (b"beam_size", b"max_length", b"alternatives"):
        status, answer = post(
            server, "a 5,000-digit integer", "/translate", b'{"q": "x", "target": "ja", "%s": %s}' % (field, huge)
        )
        assert status == 400 and "malformed JSON body" in answer["error"]
        body = b'{"q": "x", "target": "ja", "%s": %s}' % (field, b"9" * 4_000)
        assert post(server, "a 4,000-digit integer", "/translate", body)[0] == 422
    for value in (b"1e999", b"-1e999", b"NaN", b"Infinity", b"-Infinity", b"1e-999", b"-0.0"):
        for field in (b"beam_size", b"max_length", b"alternatives", b"length_penalty"):
            body = b'{"q": "x", "target": "ja", "%s": %s}' % (field, value)
            assert post(server, f"{value!r} as {field!r}", "/translate", body)[0] in (200, 422)
        for field in (b"layers", b"heads"):
            body = b'{"q": "x", "target": "ja", "%s": [%s]}' % (field, value)
            assert post(server, f"{value!r} in {field!r}", "/attention", body)[0] in (200, 422)  # 1e-999 is 0
    body = b'{"q": "x", "target": "ja", "layers": [%s]}' % (b"9" * 4_000)
    assert post(server, "a 4,000-digit layer", "/attention", body)[0] == 422


WRONG = [None, True, 0, -1, 1.5, "", "x" * 300, [], [None], [[]], {}, {"a": 1}, [1, "a"]]


def test_every_field_of_the_wrong_type(server: ServeProcess) -> None:
    openapi = httpx.get(server.url + "/openapi.json", timeout=10).json()
    schemas = openapi["components"]["schemas"]
    for path, name, base in (("/translate", "TranslateRequest", NORMAL), ("/attention", "AttentionRequest", NORMAL)):
        fields = list(schemas[name]["properties"])
        assert {"q", "target", "beam_size"} <= set(fields)
        for field in fields:
            for value in WRONG:
                body = json.dumps(base | {field: value}).encode()
                post(server, f"{path} {field}={value!r}", path, body)
            form = f"q=x&target=ja&{field}=%5B%5D&{field}=1".encode()
            post(server, f"{path} {field} twice in a form", path, form, content_type=FORM)
    for body in (b"", b"[]", b'"x"', b"null", b"1", b"{", b'{"q": "x", "target": "ja", "q": 5}'):
        status, _ = post(server, f"body {body!r}", "/translate", body)
        assert status in (400, 422)
    multipart = (
        b'--b\r\nContent-Disposition: form-data; name="q"; filename="q.txt"\r\n\r\nOpen file\r\n'
        b'--b\r\nContent-Disposition: form-data; name="target"\r\n\r\nja\r\n--b--\r\n'
    )
    status, answer = post(
        server, "q as a file", "/translate", multipart, content_type="multipart/form-data; boundary=b"
    )
    assert status == 422 and "q" in answer["error"]
    assert (
        post(server, "multipart without a boundary", "/translate", multipart, content_type="multipart/form-data")[0]
        == 400
    )


def test_long_texts_of_emoji_rtl_and_combining_marks(server: ServeProcess) -> None:
    texts = {
        "emoji": "😀🇯🇵👩‍👩‍👧‍👦🏳️‍🌈" * 500,
        "right-to-left": "مرحبا بالعالم שלום עולם " * 250,
        "combining marks": ("e" + "\u0301\u0323\u0308" * 3) * 500,
        "mixed directions": "\u202eOpen file\u202c \u200f" * 400,
        "zero-width": "\u200b\u200c\u200d\ufeff" * 1_250,
    }
    for name, text in texts.items():
        text = text[:5_000]
        assert len(text) == 5_000
        for path in ("/translate", "/attention"):
            status, answer = post(
                server,
                f"5,000 characters, {name}",
                path,
                json.dumps({"q": text, "source": "en", "target": "ja"}).encode(),
            )
            assert status in (200, 413), answer
            if status == 413:
                assert "max_tokens" in answer["error"]
        short = json.dumps({"q": [text[:20]] * 64, "source": "en", "target": "ja"}).encode()
        assert post(server, f"64 short texts, {name}", "/translate", short)[0] == 200
    status, answer = post(
        server, "5,001 characters", "/translate", json.dumps({"q": "a" * 5_001, "target": "ja"}).encode()
    )
    assert status == 413 and "max_chars=5000" in answer["error"]


def test_same_answer_after_and_a_clean_log(server: ServeProcess) -> None:
    assert normal_answers(server) == server.before  # type: ignore[attr-defined]
    assert len(statuses) > 300 and all(s is None or s < 500 for _, s in statuses)
    log = server.text()
    assert "Traceback" not in log and " ERROR " not in log and "Exception" not in log, log[-3000:]
