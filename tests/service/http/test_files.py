"""The translated-file store: random names inside its directory only, download names, expiry and sweeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import NoSuchFile
from service.http.files import FileStore, safe_name


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_save_and_open(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files", 60, Clock())
    name = store.save(b"data", "../../etc/My App (ja).po")
    assert (tmp_path / "files" / name).read_bytes() == b"data"
    stored = store.open(name)
    assert stored.path.parent == tmp_path / "files" and stored.download_name == "My_App_ja.po"
    assert store.save(b"x", "a.po") != store.save(b"x", "a.po")  # random, never reused


@pytest.mark.parametrize(
    "name",
    ["../secret", "..%2Fsecret", "/etc/passwd", "0" * 32 + "_../x", "0" * 32 + "_a/b", "0" * 32, "0" * 32 + "_.x"],
)
def test_names_cannot_leave_the_directory(tmp_path: Path, name: str) -> None:
    (tmp_path / "secret").write_text("secret")
    store = FileStore(tmp_path / "files", 60)
    store.save(b"x", "a.txt")
    with pytest.raises(NoSuchFile):
        store.open(name)


def test_expired_files_are_deleted(tmp_path: Path) -> None:
    clock = Clock()
    store = FileStore(tmp_path, 60, clock)
    (tmp_path / "other.txt").write_text("not the store's")
    old = store.save(b"old", "a.po")
    clock.now += 30
    young = store.save(b"young", "b.po")
    clock.now += 31
    with pytest.raises(NoSuchFile, match="expired"):
        store.open(old)
    assert not (tmp_path / old).exists()
    assert store.open(young).path.read_bytes() == b"young"
    clock.now += 30
    assert store.sweep() == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["other.txt"]


@pytest.mark.parametrize(
    ("upload", "safe"),
    [
        ("a.po", "a.po"),
        ("C:\\Users\\x\\ja.po", "ja.po"),
        ("..", "file"),
        ("日本.txt", "file.txt"),
        (".bashrc", "bashrc"),
        ("a.日本", "a"),
        ("x" * 300 + ".po", "x" * 97 + ".po"),
    ],
)
def test_safe_names(upload: str, safe: str) -> None:
    assert safe_name(upload) == safe
