"""GET /languages: every language the served pairs touch, each with the targets it translates into (possibly none),
in LibreTranslate's shape: Weblate keeps only the codes it finds here, target languages included."""

from __future__ import annotations

from typing import Any

from babel import Locale, UnknownLocaleError
from fastapi import APIRouter, Request

from service.http.schemas import Language
from service.http.state import state_of

router = APIRouter()

LANGUAGE_NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
    "zt": "Chinese (traditional)",
}  # fmt: skip


def language_name(code: str) -> str:
    """LibreTranslate's name for the languages it lists, else CLDR's English name (babel), else the code."""
    if code in LANGUAGE_NAMES:
        return LANGUAGE_NAMES[code]
    try:
        return str(Locale.parse(code).english_name)
    except (UnknownLocaleError, ValueError):
        return code


@router.get("/languages", response_model=list[Language])
async def languages(request: Request) -> list[dict[str, Any]]:
    """Every language of the served pairs with its ``targets``, as LibreTranslate lists them."""
    state = state_of(request)
    targets: dict[str, set[str]] = {}
    for source, target in state.models.served():
        targets.setdefault(source, set()).add(target)
        targets.setdefault(target, set())
    return [{"code": c, "name": language_name(c), "targets": sorted(t)} for c, t in sorted(targets.items())]
