"""The tiny .debs that the extraction and build tests read."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from tests.model.corpus.debs import make_deb, write_mo


@pytest.fixture
def debs(tmp_path: Path) -> Path:
    out = tmp_path / "debs"
    out.mkdir()
    copyright_text = (
        b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: GPL-2+\n"
    )
    ja = write_mo([("_Open", "開く(_O)"), ("Quit", "終了"), ("translator-credits", "山田"), ("GNOME", "GNOME")])
    make_deb(
        tmp_path / "src",
        out,
        "gnome-foo",
        {
            "usr/share/locale/ja/LC_MESSAGES/foo.mo": ja,
            "usr/share/locale/ja_JP/LC_MESSAGES/bar.mo": write_mo([("Close window", "ウィンドウを閉じる")]),
            "usr/share/locale/de/LC_MESSAGES/foo.mo": write_mo([("_Open", "Ö_ffnen")]),
            "usr/share/doc/gnome-foo/copyright": copyright_text,
        },
        {"usr/share/locale/ja/LC_TIME/foo.mo": "../LC_MESSAGES/foo.mo"},
    )
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("ja/messages.mo", write_mo([("Add books", "本を追加"), ("Quit", "終了")]))
        archive.writestr("de/messages.mo", write_mo([("Add books", "Bücher hinzufügen")]))
    make_deb(
        tmp_path / "src",
        out,
        "calibre",
        {
            "usr/share/calibre/localization/locales.zip": zipped.getvalue(),
            "usr/lib/libreoffice/program/resource/ja/LC_MESSAGES/sw.mo": write_mo([("Insert ~Table", "表の挿入(~T)")]),
        },
        {"usr/share/doc/calibre": "gnome-foo"},
    )
    return out
