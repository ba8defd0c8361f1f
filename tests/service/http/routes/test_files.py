"""POST /translate_file and GET /download_file against a real server on the tiny bundle: .po and .txt round trips,
what is refused and how, expiry, and names that try to leave the store's directory."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import polib
import pytest

from tests.service.catalogs import TEMPLATE, msgfmt_check
from tests.service.conftest import Server, ServerFactory


@pytest.fixture(scope="module")
def files_server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Server:
    from service.settings import Settings

    settings = Settings(bundles=[tiny_bundle], files_dir=tmp_path_factory.mktemp("files"), max_file_bytes=4000)
    with Server(settings) as server:
        yield server


def upload(server: Server, name: str, data: bytes, **fields: str) -> tuple[int, dict]:
    form = {"source": "en", "target": "ja", **fields}
    with server.client() as c:
        r = c.post("/translate_file", files={"file": (name, data)}, data=form)
    return r.status_code, r.json()


def download(server: Server, url: str) -> tuple[int, bytes, dict]:
    with server.client() as c:
        r = c.get(url)
    return r.status_code, r.content, dict(r.headers)


def test_a_catalog_is_translated_and_downloaded(files_server: Server, tmp_path: Path) -> None:
    status, body = upload(files_server, "demo.pot", TEMPLATE.encode())
    assert status == 200, body
    url = body["translatedFileUrl"]
    assert url.startswith(files_server.url + "/download_file/") and url.endswith("_demo.pot")
    status, data, headers = download(files_server, url)
    assert status == 200
    assert headers["content-type"].startswith("text/x-gettext-translation")
    assert 'filename="demo.pot"' in headers["content-disposition"]
    catalog = polib.pofile(data.decode())
    assert catalog.metadata["Language"] == "ja"
    live = [e for e in catalog if not e.obsolete]
    assert all(e.msgstr or (e.msgstr_plural and all(e.msgstr_plural.values())) for e in live)
    assert {e.msgid: e.msgstr for e in live}["Save"] == "保存"
    (tmp_path / "ja.po").write_bytes(data)
    msgfmt_check(tmp_path / "ja.po")


def test_a_text_file_keeps_its_lines(files_server: Server) -> None:
    status, body = upload(files_server, "notes.TXT", b"Open file\n\n  Save\n", source="auto")
    assert status == 200, body
    status, data, headers = download(files_server, body["translatedFileUrl"])
    lines = data.decode().split("\n")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert len(lines) == 4 and lines[1] == "" and lines[2].startswith("  ") and lines[3] == ""
    assert "Open file" not in lines[0]


def test_an_html_file_keeps_its_markup(files_server: Server) -> None:
    page = b'<!DOCTYPE html>\n<html><body><p class="x">Open <b>file</b></p><script>var a = 1;</script></body></html>'
    status, body = upload(files_server, "page.html", page)
    assert status == 200, body
    status, data, headers = download(files_server, body["translatedFileUrl"])
    html = data.decode()
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert html.startswith("<!DOCTYPE html>") and '<p class="x">' in html and "<b>" in html
    assert "<script>var a = 1;</script>" in html and "Open" not in html


@pytest.mark.parametrize(
    ("name", "data", "fields", "status", "needle"),
    [
        ("a.docx", b"x", {}, 400, "not accepted; send .html, .po, .pot, .txt"),
        ("a.html", b"<p>caf\xe9</p>", {}, 400, "not UTF-8"),
        ("a.po", b"hello\n", {}, 400, "not a gettext catalog"),
        ("a.txt", b"caf\xe9", {}, 400, "not UTF-8"),
        ("a.txt", b"", {}, 422, "file: it is empty"),
        ("a.txt", b"x" * 4001, {}, 413, "max_file_bytes=4000"),
        ("a.txt", b"x", {"target": "xx"}, 400, "no model translates en→xx"),
        ("a.po", TEMPLATE.replace("Language: \\n", "Language: de\\n").encode(), {}, 400, "for language 'de'"),
    ],
)
def test_refusals(files_server: Server, name: str, data: bytes, fields: dict, status: int, needle: str) -> None:
    got, body = upload(files_server, name, data, **fields)
    assert got == status and needle in body["error"], body


def test_missing_parts(files_server: Server) -> None:
    with files_server.client() as c:
        no_file = c.post("/translate_file", data={"source": "en", "target": "ja"})
        no_target = c.post("/translate_file", files={"file": ("a.txt", b"x")})
        json_body = c.post("/translate_file", json={"target": "ja"})
        query = c.post("/translate_file?source=en&target=ja", files={"file": ("a.txt", b"Open")})
    assert no_file.status_code == 422 and no_file.json()["error"].startswith("file: missing")
    assert no_target.status_code == 422 and no_target.json()["error"].startswith("target: missing")
    assert json_body.status_code == 422
    assert query.status_code == 200  # fields from the query string, as LibreTranslate clients may send them


@pytest.mark.parametrize(
    "path",
    [
        "/download_file/../../etc/passwd",
        "/download_file/..%2F..%2Fetc%2Fpasswd",
        "/download_file/%2Fetc%2Fpasswd",
        "/download_file//etc/passwd",
        "/download_file/..",
        "/download_file/" + "0" * 32 + "_a.po",
        "/download_file/" + "0" * 32 + "_..%2F..%2Fsecret",
    ],
)
def test_download_names_cannot_leave_the_directory(files_server: Server, path: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", files_server.port, timeout=30)
    connection.request("GET", path)  # as written: httpx would resolve the dot segments first
    response = connection.getresponse()
    body = json.loads(response.read())
    connection.close()
    assert response.status == 404 and "error" in body


def test_files_expire(make_server: ServerFactory, tmp_path: Path) -> None:
    server = make_server(files_dir=tmp_path, file_ttl_s=0.5)
    status, body = upload(server, "a.txt", b"Open file\n")
    assert status == 200
    assert download(server, body["translatedFileUrl"])[0] == 200
    time.sleep(0.6)
    status, data, _ = download(server, body["translatedFileUrl"])
    assert status == 404 and b"expired" in data
    assert list(tmp_path.iterdir()) == []


def test_api_key(make_server: ServerFactory, tmp_path: Path) -> None:
    server = make_server(files_dir=tmp_path, api_keys=["k1"])
    assert upload(server, "a.txt", b"Open")[0] == 403
    assert upload(server, "a.txt", b"Open", api_key="k1")[0] == 200


def test_openapi_lists_the_file_routes(files_server: Server) -> None:
    with files_server.client() as c:
        schema = c.get("/openapi.json").json()
    body = schema["paths"]["/translate_file"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["properties"]["file"]["format"] == "binary"
    assert "/download_file/{name}" in schema["paths"]
