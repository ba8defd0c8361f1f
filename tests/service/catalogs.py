"""A gettext template with every kind of entry translate-po must handle, and msgfmt as the judge of the output."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

TEMPLATE = r"""# SOME DESCRIPTIVE TITLE.
# Copyright (C) YEAR THE PACKAGE'S COPYRIGHT HOLDER
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\n"
"POT-Creation-Date: 2024-01-01 00:00+0000\n"
"PO-Revision-Date: YEAR-MO-DA HO:MI+ZONE\n"
"Last-Translator: FULL NAME <EMAIL@ADDRESS>\n"
"Language-Team: LANGUAGE <LL@li.org>\n"
"Language: \n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"

#. TRANSLATORS: the file's name follows
#: src/main.c:10
#, c-format
msgid "Open %s"
msgstr ""

#: src/main.c:12
#, python-format
msgid "Delete %(count)d files from %(folder)s?"
msgstr ""

msgid ""
"\n"
"Usage: demo [options]\n"
"\n"
"  --help   show this help\n"
msgstr ""

msgctxt "menu"
msgid "Save"
msgstr "保存"

#, fuzzy
msgid "Close"
msgstr ""

#, c-format
msgid "One file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

msgid "Settings "
msgstr ""

#~ msgid "Old entry"
#~ msgstr "古い項目"
"""

EMPTY_SLOTS = 6  # Open, Delete, Usage, Close, Settings and the plural's one Japanese form; Save is translated


def msgfmt_check(path: Path) -> None:
    """``msgfmt --check --use-fuzzy`` passes on ``path`` (fuzzy entries checked too: translate-po marks its own)."""
    exe = shutil.which("msgfmt")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("msgfmt is missing: apt-get install gettext")
        pytest.skip("msgfmt (Debian package gettext) is not installed")
    done = subprocess.run([exe, "--check", "--use-fuzzy", "-o", os.devnull, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
