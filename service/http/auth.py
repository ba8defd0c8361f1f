"""API keys and bearer tokens, compared in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request

from service.http.errors import Forbidden
from service.settings import Settings


def bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None without one."""
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def matches(given: str, secret: str) -> bool:
    """Whether ``given`` equals ``secret``, in a time that does not tell how much of it matched."""
    return hmac.compare_digest(given.encode(), secret.encode())


def check_api_key(settings: Settings, request: Request, body_key: str | None) -> None:
    """Pass when no keys are configured or ``api_key`` (else a Bearer token) is one of them.

    Raises:
        Forbidden: keys are configured and the request has no matching one.
    """
    keys = settings.api_keys
    if not keys:
        return
    given = body_key or bearer(request)
    if given is None or not any(matches(given, k) for k in keys):
        what = "a wrong API key" if given else "no API key"
        raise Forbidden(f"{what}: send a valid key as 'api_key' or 'Authorization: Bearer <key>'")
