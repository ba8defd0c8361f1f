"""Cleaning catalog pairs (accelerators, project conventions, whitespace) and the rules that keep or drop them."""

from __future__ import annotations

import re
import unicodedata

MAX_CHARS = 200  # longer UI strings are mostly help paragraphs with markup; they dominate the padding budget
MAX_WIDTH_RATIO = 3.0  # display widths (CJK = 2) of source and target may differ at most this much ...
RATIO_SMOOTHING = 4  # ... after adding this many columns to both: "Up" → "上へ移動" (2 vs 8 columns) is a good pair
CJK_LANGS = frozenset({"ja", "zh", "ko"})

DROP_RULES = (  # the reasons keep_pair() gives, in the order it checks them
    "empty",
    "credits",
    "same",
    "too_long",
    "format_only",
    "code",
    "placeholder_mismatch",
    "no_target_script",
    "length_ratio",
)

WHITESPACE_RE = re.compile(r"\s+")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200b\ufeff]")
# "保存(_S)", "ファイル(&F)", "開く(~O)..." (LibreOffice marks with "~"), also with full-width parentheses.
_MARKED_SUFFIX_RE = re.compile(r"\s*[(（][_&~][A-Za-z0-9][)）]")
# "ファイル(F)": an unmarked accelerator letter in parentheses, at the end or before "...", "…" or ":".
_BARE_SUFFIX_RE = re.compile(r"\s*[(（][A-Z0-9][)）](?=\s*(?:\.\.\.|…|:|：)?\s*$)")
_UNDERSCORE_RE = re.compile(r"(?<![\w_])_(?=[^\W_])")  # "_File", "Save _As"; not "foo_bar", not "__"
_MID_UNDERSCORE_RE = re.compile(r"(?<=[^\W_])_(?=[^\W_])")  # "Or_ientation", but also "max_connections"
_TOKEN_RE = re.compile(r"[\w.-]+")
# "&File", "Fi&le"; not "&&", not entities (&amp; &#38; &#x26;); "AT&T" and "Q&A" are checked in _ampersand().
_AMPERSAND_RE = re.compile(r"(?<!&)&(?=[^\W_])(?!(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);)")
# LibreOffice's "~Save", "Pr~eview"; not "~/path", "~5", "0~150", "A~Z".
_TILDE_RE = re.compile(r"(?<![\w~/])~(?=[A-Za-z])|(?<=[A-Za-z])~(?=[a-z])")


def _ampersand(match: re.Match[str]) -> str:
    text, start = match.string, match.start()
    between_capitals = start > 0 and text[start - 1].isupper() and text[start + 1].isupper()
    return "&" if between_capitals else ""  # AT&T, Q&A, R&D stay


def strip_accelerators(text: str, lang: str, other: str | None = None) -> str:
    """Remove keyboard-accelerator markers from a UI string.

    Handles GTK's ``_File``, Qt/KDE's ``&File`` and ``Fi&le`` (``&&``, HTML entities like ``&amp;`` and ``AT&T`` are
    left alone), LibreOffice's ``~File`` and ``Pr~eview``, and the parenthesized suffixes of CJK translations:
    ``ファイル(_F)``, ``ファイル(&F)``, ``（_F）``; for CJK languages also the unmarked ``ファイル(F)`` at the end.

    An underscore inside a word (GTK's ``Or_ientation``) looks like an identifier (``max_connections``), so it is
    only removed when the other side of the pair is given and does not contain the word: translators copy
    identifiers, never accelerators. It must also be the text's only underscore, and not follow capitals
    (``MZ_leaves``).

    Args:
        text: The UI string.
        lang: Its language code; the unmarked suffix form is only removed for ``ja``, ``zh`` and ``ko``.
        other: The other side of the pair (raw), or None to leave underscores inside words alone.

    Returns:
        The text without markers (whitespace is not collapsed here).
    """
    text = _MARKED_SUFFIX_RE.sub("", text)
    if lang in CJK_LANGS:
        text = _BARE_SUFFIX_RE.sub("", text)
    text = _UNDERSCORE_RE.sub("", text)
    if other is not None and text.count("_") == 1 and (match := _MID_UNDERSCORE_RE.search(text)):
        token = next(t for t in _TOKEN_RE.finditer(text) if t.start() <= match.start() < t.end()).group()
        head = token.split("_")[0]
        if token not in other and not (len(head) > 1 and head.isupper()):
            text = text[: match.start()] + text[match.end() :]
    text = _AMPERSAND_RE.sub(_ampersand, text)
    return _TILDE_RE.sub("", text)


_FREECIV_QUALIFIER_RE = re.compile(r"^\?[^:?]{1,40}:(?=\S)")  # freeciv's Q_("?plural:Frisians")
_LYX_CONTEXT_RE = re.compile(r"\[\[[a-z][a-z ,'-]*\]\]")  # LyX's "mu[[unit of measure]]"
_LYX_SHORTCUT_RE = re.compile(r"\|#?[^\s|]$")  # LyX's menu shortcut "Simple Frame|F"
_KDE_SCRIPT_SEPARATOR = "|/|"  # KDE Transcript: "translation|/|$[script]"
_PIPE_CONTEXT_RE = re.compile(r"^[A-Za-z]\w*\|(?=[^|\s][^|]*$)")  # Qt/fontforge "Layer|Background", "Panose|Any"


def clean_text(text: str, lang: str, other: str | None = None) -> str:
    """Normalize one side of a pair: NFC, accelerators removed, control characters dropped, whitespace collapsed.

    Args:
        text: The raw catalog string.
        lang: Its language code (see :func:`strip_accelerators`).
        other: The other side of the pair (raw), to tell accelerators from identifiers (see
            :func:`strip_accelerators`).

    Returns:
        A single-line string without tabs, newlines or leading/trailing spaces.
    """
    text = unicodedata.normalize("NFC", text)
    text = WHITESPACE_RE.sub(" ", text)  # before stripping: "\n_Open" must still see a word start
    text = strip_accelerators(text, lang, other)
    text = _CONTROL_RE.sub("", text)
    return WHITESPACE_RE.sub(" ", text).strip()


def clean_pair(source: str, target: str, target_lang: str) -> tuple[str, str]:
    """Clean a raw (English, translation) pair from a catalog.

    Besides :func:`clean_text` on each side, removes what some projects put in their strings for their own tools:
    freeciv's ``?qualifier:`` prefix, LyX's ``[[context]]`` and ``|S`` shortcut suffix, a ``Context|`` prefix
    (``Layer|Background``, when the translation has no ``|``), and the KDE Transcript script after ``|/|`` in a
    translation.

    Args:
        source: The raw English msgid.
        target: The raw translation.
        target_lang: The translation's language code.

    Returns:
        The cleaned (source, target).
    """
    target = target.split(_KDE_SCRIPT_SEPARATOR, 1)[0]
    source, target = (_LYX_SHORTCUT_RE.sub("", _LYX_CONTEXT_RE.sub("", side)) for side in (source, target))
    source = _FREECIV_QUALIFIER_RE.sub("", source)
    if "|" not in target:
        source = _PIPE_CONTEXT_RE.sub("", source)
    return clean_text(source, "en", other=target), clean_text(target, target_lang, other=source)


def display_width(text: str) -> int:
    """The width of a text in terminal columns: 2 for wide and full-width (CJK) characters, else 1.

    A length ratio of raw character counts treats "ファイルを開く" (7 characters) as shorter than "Open file" (9),
    while it carries as much information; widths make the ratio fair across scripts.
    """
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


PLACEHOLDER_RE = re.compile(
    r"%%"  # a literal percent sign (filtered out by placeholders())
    r"|%\([A-Za-z_]\w*\)[-+#0 ]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"  # Python: %(name)s
    r"|%(?:\d+\$)?[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64)?[diouxXeEfFgGaAcspn]"  # C: %s %5.2f
    r"|%\d+"  # Qt / KDE: %1
    r"|\{[A-Za-z0-9_]*(?:[!:][^{}]*)?\}"  # Python / C#: {0} {name} {:d}
)


def placeholders(text: str) -> list[str]:
    """The format placeholders in a text, sorted, with positional C forms normalized (``%2$s`` → ``%s``).

    Translators reorder arguments with ``%2$s``; the multiset of placeholders is what must match between source and
    target.
    """
    found = [m.group() for m in PLACEHOLDER_RE.finditer(text) if m.group() != "%%"]
    return sorted(re.sub(r"^%\d+\$", "%", p) for p in found)


# KDE's and GNOME's conventions for the translators' names and addresses: never a translation.
_CREDITS_RE = re.compile(
    r"^(?:translator[-_]credits|translatorcredits|your names|your emails|(?:name|email)s? of translators"
    r"|roles[-_ ]of[-_ ]translators|credit[-_ ]for[-_ ]translators|(?-i:TRANSLATORS))$",
    re.IGNORECASE,
)
# Labels that are either a real UI string ("Translators" → "翻訳者") or the credits themselves (a list of names).
_MAYBE_CREDITS_RE = re.compile(
    r"^(?:translators?|translator credits|translated by|translation credits|your names?|your e-?mails?)[:.]?$",
    re.IGNORECASE,
)
_NAMES_RE = re.compile(r"[@,<]|\S+ \S+ \S+")  # an address, a list, or three or more names
# Markup that leaves no words behind (kept in the pair, ignored by the format_only check); "<Any>" is a word.
_TAG_RE = re.compile(
    r"</?(?:a|b|big|body|br|center|code|div|em|font|h[1-6]|head|hr|html|i|img|li|nobr|ol|p|pre|qt|s|small|span"
    r"|strong|sub|sup|table|td|th|tr|tt|u|ul)\b[^<>]*>",
    re.IGNORECASE,
)
_ENTITY_RE = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")
_SYNONYM_LIST_RE = re.compile(r"[^\s;];[^\s;]")  # KDE unit names: "kilogram;kilograms;kg"
_URL_OR_PATH_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|www\.|mailto:|~?/|\.\.?/|[A-Za-z]:\\)|^[^@\s]+@[^@\s]+\.\w+$")
_IDENTIFIER_RES = (
    re.compile(r"[^\W_]_[^\W_]"),  # snake_case, CONSTANT_NAME
    re.compile(r"[a-z][A-Z]"),  # camelCase, CamelCase
    re.compile(r"[A-Za-z]\.[A-Za-z]"),  # org.gnome.Foo, file.txt
    re.compile(r"^-{1,2}[A-Za-z]"),  # --option
    re.compile(r"\w(?:=|\[|\((?!s\)))"),  # key=value, call(), array[0]; not "file(s)"
    re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*-(?:symbolic|ltr|rtl)$|^(?:gtk|gnome|stock|gimp|kde)-[a-z0-9-]+$"),
)
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]")


def is_code(text: str) -> bool:
    """Whether a source string is a code identifier, a path or a URL rather than something a user reads.

    Single tokens (no space): ``foo_bar``, ``gtk-ok``, ``fooBar``, ``org.gnome.Foo``, ``--help``, ``key=value``,
    ``/usr/bin``, ``https://example.org``; hyphenated words (``read-only``, ``e-mail``), ``TCP/IP`` and
    ``(default)`` are words. Any text: semicolon-separated synonym lists (``kilogram;kilograms;kg``), whose
    translations append to the list instead of translating it.
    """
    if _SYNONYM_LIST_RE.search(_ENTITY_RE.sub(" ", text)):
        return True
    if " " in text:
        return False
    if _URL_OR_PATH_RE.search(text):
        return True
    return any(pattern.search(text) for pattern in _IDENTIFIER_RES)


def has_letters(text: str) -> bool:
    """Whether a text has letters outside its placeholders and markup tags (``"%s: %s"`` and ``"<b>%s</b>"`` do not)."""
    return any(ch.isalpha() for ch in _TAG_RE.sub("", PLACEHOLDER_RE.sub("", text)))


def width_ratio_too_large(source: str, target: str) -> bool:
    """Whether the display widths of the two sides differ more than :data:`MAX_WIDTH_RATIO` times.

    Widths are smoothed by :data:`RATIO_SMOOTHING` columns, so short labels, whose ratio is noise ("Vertical Line" →
    "縦線", 13 vs 4 columns), pass, while "Decimal places. The number of fixed decimal places that are to be
    displayed." → "小数点以下の桁数。" (77 vs 18) does not.
    """
    source_width, target_width = display_width(source), display_width(target)
    longer, shorter = max(source_width, target_width), min(source_width, target_width)
    return longer + RATIO_SMOOTHING > MAX_WIDTH_RATIO * (shorter + RATIO_SMOOTHING)


def keep_pair(source: str, target: str, target_lang: str | None = None) -> str | None:
    """Decide whether a cleaned pair belongs in the corpus.

    The rules, checked in the order of :data:`DROP_RULES`:

    - ``empty``: a side is empty.
    - ``credits``: the translator-credits entries ("translator-credits", "Your names", ...), and labels such as
      "Translators" whose translation is a list of names rather than a word.
    - ``same``: the target equals the source (untranslated).
    - ``too_long``: a side has more than :data:`MAX_CHARS` characters.
    - ``format_only``: the source has no letters once placeholders and markup are removed ("%s: %s").
    - ``code``: :func:`is_code`.
    - ``placeholder_mismatch``: source and target placeholders differ (:func:`placeholders`): the model must learn
      to copy them exactly, never to invent or lose one ("1 day ago" → "%d日前", strftime formats).
    - ``no_target_script``: for a CJK target language, the target has no CJK character (left in English).
    - ``length_ratio``: :func:`width_ratio_too_large`.

    Args:
        source: The cleaned English text (see :func:`clean_pair`).
        target: The cleaned translation.
        target_lang: The translation's language code; None skips the ``no_target_script`` rule.

    Returns:
        None to keep the pair, else the name of the rule that drops it.
    """
    if not source or not target:
        return "empty"
    if _CREDITS_RE.match(source) or (_MAYBE_CREDITS_RE.match(source) and _NAMES_RE.search(target)):
        return "credits"
    if source == target:
        return "same"
    if len(source) > MAX_CHARS or len(target) > MAX_CHARS:
        return "too_long"
    if not has_letters(source):
        return "format_only"
    if is_code(source):
        return "code"
    if placeholders(source) != placeholders(target):
        return "placeholder_mismatch"
    if target_lang in CJK_LANGS and not _CJK_RE.search(target):
        return "no_target_script"
    if width_ratio_too_large(source, target):
        return "length_ratio"
    return None


# --------------------------------------------------------------------------------------------------------------------
