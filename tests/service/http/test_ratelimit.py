"""Per-key and per-address limits: the buckets alone on a fake clock, then a real server with a JSON keys file."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from service.http import keys as keys_module
from service.http.keys import UNLIMITED, KeyLimits, Keys, KeysFileError, parse_keys
from service.http.ratelimit import Buckets
from service.settings import Settings
from tests.service.conftest import ServerFactory

OK = {"q": "Open file", "source": "en", "target": "ja"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_spends_a_minute_at_once_then_refills_evenly() -> None:
    b = Buckets()
    for _ in range(6):
        assert b.wait("c", 1, 6, 0.0) == 0
        b.take("c", 1, 6, 0.0)
    assert b.wait("c", 1, 6, 0.0) == pytest.approx(10.0)  # one request every 60 / 6 s
    assert b.wait("c", 1, 6, 9.9) == pytest.approx(0.1)
    assert b.wait("c", 1, 6, 10.0) == 0
    assert b.wait("other", 6, 6, 0.0) == 0  # other clients have their own bucket
    assert b.wait("c", 2, 6, 10.0) == pytest.approx(10.0)


def test_buckets_drop_full_ones_past_the_prune_size() -> None:
    b = Buckets()
    b.prune_at = 3
    for i in range(3):
        b.take(f"c{i}", 1, 60, 0.0)
    b.take("late", 1, 60, 100.0)  # the first three are full again by then
    assert list(b.full_at) == ["late"]


def test_parse_both_formats() -> None:
    assert parse_keys("# a comment\nk1\n\n  k2  \n") == {"k1": UNLIMITED, "k2": UNLIMITED}
    text = '{"a": {"requests_per_minute": 5}, "b": {}, "c": {"chars_per_request": 9, "chars_per_minute": 99}}'
    parsed = parse_keys(text)
    assert parsed == {
        "a": KeyLimits(requests_per_minute=5),
        "b": UNLIMITED,
        "c": KeyLimits(chars_per_request=9, chars_per_minute=99),
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"secret-key": {"requests_per_minut": 5}}', "entry 1: requests_per_minut: Extra inputs"),
        ('{"a": {}, "secret-key": {"chars_per_minute": 0}}', "entry 2: chars_per_minute: Input should be greater"),
        ('{"secret-key": 5}', "entry 1: value: Input should be a valid dictionary"),
        ('{"secret-key": {}', "not valid JSON"),
        ('{" ": {}}', "entry 1: the key is empty"),
    ],
)
def test_parse_errors_name_the_entry_never_the_key(text: str, message: str) -> None:
    with pytest.raises(KeysFileError, match=message) as e:
        parse_keys(text)
    assert "secret-key" not in str(e.value)


def test_a_bad_keys_file_stops_settings(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"k": {"requests_per_minute": -1}}')
    with pytest.raises(ValueError, match=f"ATTNSERVE_API_KEYS_FILE: {path}: entry 1: requests_per_minute"):
        Settings(api_keys_file=path)
    with pytest.raises(ValueError, match="cannot read it"):
        Settings(api_keys_file=tmp_path / "missing")


def test_keys_compare_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = keys_module.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", spy)
    keys = Keys(["alpha"], None)
    assert keys.lookup("alpha") is UNLIMITED
    assert keys.lookup("beta") is None
    assert calls == [(b"alpha", b"alpha")]  # found by digest, then compared in constant time


def test_keys_file_is_reread_when_it_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, clock = tmp_path / "keys", Clock()
    path.write_text("old-key\n")
    keys = Keys(["env-key"], path, clock)
    assert keys.lookup("old-key") is UNLIMITED and keys.lookup("env-key") is UNLIMITED
    path.write_text('{"new-key": {"requests_per_minute": 3}, "env-key": {"chars_per_request": 7}}')
    os.utime(path, ns=(1, 1))  # a stamp of its own even where mtimes are coarse
    assert keys.lookup("new-key") is None  # checked at most once a second
    clock.now += 1.0
    assert keys.lookup("new-key") == KeyLimits(requests_per_minute=3)
    assert keys.lookup("old-key") is None
    assert keys.lookup("env-key") == KeyLimits(chars_per_request=7)  # the file's limits win
    with caplog.at_level(logging.WARNING, "attnserve"):
        path.write_text("{broken")
        clock.now += 1.0
        assert keys.lookup("new-key") == KeyLimits(requests_per_minute=3)  # the previous keys stay
    assert "keeping the previous keys" in caplog.text and "new-key" not in caplog.text


def test_per_key_limits_on_a_server(make_server: ServerFactory, tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    limits = {
        "key-slow": {"requests_per_minute": 2},
        "key-short": {"chars_per_request": 12},
        "key-chars": {"chars_per_minute": 20},
        "key-free": {},
    }
    path.write_text(json.dumps(limits))
    server = make_server(api_keys_file=path)
    with server.client() as c:

        def post(key: str, q: str | list[str] = "Open file", path: str = "/translate") -> tuple[int, dict, str]:
            r = c.post(path, json={**OK, "q": q, "api_key": key})
            return r.status_code, r.json(), r.headers.get("retry-after", "")

        assert [post("key-slow")[0], post("key-slow", path="/attention")[0]] == [200, 200]
        status, body, retry = post("key-slow")
        assert status == 429 and "requests_per_minute=2" in body["error"] and 0 < int(retry) <= 30
        assert post("key-free")[0] == 200  # other keys are unaffected
        status, body, _ = post("key-slow", ["a", "b", "c"])
        assert status == 413 and "requests_per_minute=2" in body["error"]  # three texts can never fit

        assert post("key-short", "twelve chars")[0] == 200
        status, body, _ = post("key-short", ["Open", "the files"])
        assert status == 413 and body["error"] == (
            "13 characters in one request; this API key's limit is chars_per_request=12"
        )
        assert post("key-chars", "Open file" * 2)[0] == 200
        status, body, retry = post("key-chars", "Open file")
        assert status == 429 and "chars_per_minute=20" in body["error"] and int(retry) >= 1
        assert post("key-chars", "x" * 21)[0] == 413

        assert post("wrong")[0] == 403
        metrics = c.get("/metrics").text
    rejected = {ln.split('reason="')[1].split('"')[0]: float(ln.split()[-1]) for ln in metrics.splitlines()
                if 'rejected_total{pair=""' in ln}  # fmt: skip
    assert rejected["rate_limited"] == 2 and rejected["key_limited"] == 3 and rejected["auth"] == 1
    assert not any(key in metrics for key in limits)


def test_a_file_counts_one_request_and_the_characters_it_translates(make_server: ServerFactory, tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    limits = {
        "key-chars": {"chars_per_minute": 30},
        "key-short": {"chars_per_request": 10},
        "key-one": {"requests_per_minute": 1},
    }
    path.write_text(json.dumps(limits))
    server = make_server(api_keys_file=path)
    with server.client() as c:

        def upload(key: str, text: str) -> int:
            form = {"target": "ja", "api_key": key}
            return c.post("/translate_file", files={"file": ("a.txt", text.encode())}, data=form).status_code

        assert upload("key-chars", "Open the file\n\n  Save it\n") == 200  # 13 + 7 characters translated
        assert c.post("/translate", json={**OK, "q": "Open the file", "api_key": "key-chars"}).status_code == 429
        assert c.post("/translate", json={**OK, "q": "Open", "api_key": "key-chars"}).status_code == 200
        assert upload("key-chars", "x" * 31) == 413  # over the minute's characters alone
        assert upload("key-short", "Open the file") == 413
        assert upload("key-short", "Open it") == 200
        assert upload("key-one", "\n \n") == 200  # nothing to translate: still one request
        assert upload("key-one", "Open it") == 429


def test_the_keys_file_changes_without_a_restart(make_server: ServerFactory, tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("first\n")
    server = make_server(api_keys_file=path)
    with server.client() as c:
        assert c.post("/translate", json={**OK, "api_key": "first"}).status_code == 200
        assert c.post("/translate", json={**OK, "api_key": "second"}).status_code == 403
        path.write_text('{"second": {"requests_per_minute": 1}}')
        time.sleep(1.1)
        assert c.post("/translate", json={**OK, "api_key": "second"}).status_code == 200
        assert c.post("/translate", json={**OK, "api_key": "first"}).status_code == 403
        assert c.post("/translate", json={**OK, "api_key": "second"}).status_code == 429


def test_clients_without_keys_are_limited_by_address(make_server: ServerFactory) -> None:
    server = make_server(requests_per_minute=3)
    with server.client() as c:
        statuses = [c.post("/translate", json=OK).status_code for _ in range(3)]
        over = c.post("/translate", json={**OK, "q": ["a"]})
        assert c.get("/languages").status_code == 200  # only translation counts
    assert statuses == [200, 200, 200]
    assert over.status_code == 429 and "this client address's requests_per_minute=3" in over.json()["error"]
    assert int(over.headers["retry-after"]) == 20
