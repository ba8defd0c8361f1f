"""``attnserve attention``: --json is /attention's answer; a file of texts (or standard input) to JSON Lines, one
answer a line, each /attention's answer for its text; the filters and raw as the HTTP fields."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from service.cli.main import main
from tests.service.conftest import Server

TEXTS = ["Delete the selected files?", "Open %s\nSave the file", "Settings"]


def http(server: Server, **body: object) -> object:
    with server.client() as c:
        r = c.post("/attention", json={"source": "en", "target": "ja", **body})
    assert r.status_code == 200, r.text
    return r.json()


def assert_same(got: object, want: object) -> None:
    """Equal JSON, numbers within float32 batching's differences."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, list) and want and isinstance(want[0], (list, float)):
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5)
    else:
        assert got == want


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        ([], {}),
        (
            ["--kinds", "cross,encoder", "--layers", "1", "--heads", "0,2", "--raw", "--target-text", "%sを開く\n保存"],
            {
                "kinds": ["cross", "encoder"],
                "layers": [1],
                "heads": [0, 2],
                "raw": True,
                "target_text": "%sを開く\n保存",
            },
        ),
        (["--beam-size", "2", "--max-length", "5"], {"beam_size": 2, "max_length": 5}),
    ],
    ids=["default", "filters-raw-forced", "beam"],
)
def test_json_is_the_http_answer(
    server: Server, tiny_bundle: Path, capsys: pytest.CaptureFixture, flags: list[str], fields: dict
) -> None:
    assert main(["attention", TEXTS[1], "--bundle", str(tiny_bundle), "--json", *flags]) == 0
    assert_same(json.loads(capsys.readouterr().out), http(server, q=TEXTS[1], **fields))


def test_a_file_of_texts_to_json_lines(
    server: Server, tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "texts.txt"
    path.write_text("".join(t.replace("\n", " ") + "\n" for t in TEXTS), encoding="utf-8")
    texts = path.read_text(encoding="utf-8").splitlines()
    want = http(server, q=texts, kinds=["cross"])
    assert isinstance(want, list)
    argv = ["attention", "--bundle", str(tiny_bundle), "--kinds", "cross", "--batch-size", "2", "--file"]
    assert main([*argv, str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(texts)
    for line, answer in zip(lines, want, strict=True):
        assert_same(json.loads(line), answer)
    monkeypatch.setattr("sys.stdin", io.StringIO(path.read_text(encoding="utf-8")))
    assert main([*argv, "-"]) == 0
    assert capsys.readouterr().out.splitlines() == lines


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["Open file", "--file", "texts.txt"], "give a text or --file"),
        ([], "give a text or --file"),
        (["--file", "texts.txt", "--target-text", "開く"], "does not go with --file"),
        (["--file", "blank.txt"], "line 2 has no text"),
        (["Open file", "--layers", "5"], "layers [5] do not exist"),
    ],
)
def test_arguments_that_do_not_go_together(
    tiny_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    argv: list[str], needle: str,
) -> None:  # fmt: skip
    (tmp_path / "texts.txt").write_text("Open file\n")
    (tmp_path / "blank.txt").write_text("Open file\n \nSave\n")
    monkeypatch.chdir(tmp_path)
    assert main(["attention", "--bundle", str(tiny_bundle), *argv]) == 2
    assert needle in capsys.readouterr().err


def test_a_kind_that_does_not_exist_is_refused_by_the_parser(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["attention", "Open file", "--kinds", "cross,self"])
    assert e.value.code == 2 and "self: the kinds are encoder, decoder, cross" in capsys.readouterr().err
