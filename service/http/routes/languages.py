"""GET /languages: the served pairs, in LibreTranslate's shape."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service.http.schemas import Language
from service.http.state import state_of

router = APIRouter()

LANGUAGE_NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish", "fr": "French",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ru": "Russian", "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}  # fmt: skip


@router.get("/languages", response_model=list[Language])
async def languages(request: Request) -> list[dict[str, Any]]:
    """The served pairs, in LibreTranslate's shape."""
    state = state_of(request)
    targets: dict[str, list[str]] = {}
    for source, target in state.engines:
        targets.setdefault(source, []).append(target)
    return [{"code": s, "name": LANGUAGE_NAMES.get(s, s), "targets": sorted(t)} for s, t in sorted(targets.items())]
