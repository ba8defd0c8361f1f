"""The format directives that ``msgfmt --check`` compares between a msgid and its msgstr, by the entry's
``*-format`` flags: a translation that loses or adds one would be rejected by msgfmt and format the wrong thing."""

from __future__ import annotations

import re
from collections.abc import Sequence

# printf, as C, Python (%(name)s), PHP, Perl, shell and awk write it; %% is a literal, not a directive.
PRINTF = re.compile(r"%(?:\d+\$|\([^)]*\))?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|[hlLqjzt])?[a-zA-Z%]")
BRACE = re.compile(r"\{\{|\}\}|\{[^{}]*\}")  # Python's str.format, Java's MessageFormat, C#, Perl brace
NUMBERED = re.compile(r"%L?\d+")  # Qt and KDE: %1, %L2
_LITERALS = {"%%", "{{", "}}"}
_FAMILIES: dict[str, re.Pattern[str]] = {
    **dict.fromkeys(("c", "objc", "python", "php", "perl", "sh", "awk", "gcc-internal", "gfc-internal"), PRINTF),
    **dict.fromkeys(("python-brace", "java", "java-printf", "csharp", "perl-brace", "javascript"), BRACE),
    **dict.fromkeys(("qt", "qt-plural", "kde", "kde-kuit"), NUMBERED),
}
_FLAG_RE = re.compile(r"([a-z-]+)-format")


def patterns(flags: Sequence[str]) -> list[re.Pattern[str]]:
    """The directive patterns an entry's flags ask msgfmt to check (``c-format`` → printf; ``no-c-format`` none);
    a format this table does not know is checked as printf and brace forms both."""
    out: list[re.Pattern[str]] = []
    for flag in flags:
        match = _FLAG_RE.fullmatch(flag.strip())
        if match is None or match.group(1).startswith("no-"):
            continue
        out.extend([_FAMILIES[match.group(1)]] if match.group(1) in _FAMILIES else [PRINTF, BRACE])
    return out


def directives(text: str, pattern: re.Pattern[str]) -> list[str]:
    """The directives of ``text`` in order, literals (``%%``, ``{{``) left out."""
    return [m.group() for m in pattern.finditer(text) if m.group() not in _LITERALS]


def keeps_directives(source: str, translation: str, flags: Sequence[str]) -> bool:
    """Whether ``translation`` has the directives of ``source`` that the flags make msgfmt check: the same ones, in
    the same order unless they are numbered (``%1$s``) or named (``%(n)s``, ``{name}``), which a translation may
    reorder."""
    for pattern in patterns(flags):
        if pattern is PRINTF and "%" in PRINTF.sub("", translation):
            return False  # a stray % starts a directive msgfmt cannot read
        want, got = directives(source, pattern), directives(translation, pattern)
        if sorted(want) != sorted(got):
            return False
        if pattern is PRINTF and want != got and any(not re.match(r"%(\d+\$|\()", d) for d in want):
            return False
    return True
