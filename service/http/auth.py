"""Where a request carries its API key or bearer token, and comparing secrets in constant time."""

from __future__ import annotations

import hmac

from fastapi import Request


def bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None without one."""
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def given_key(request: Request, body_key: str | None) -> str | None:
    """The request's API key: the ``api_key`` field, else a Bearer token, else None."""
    return body_key or bearer(request)


def matches(given: str, secret: str) -> bool:
    """Whether ``given`` equals ``secret``, in a time that does not tell how much of it matched."""
    return hmac.compare_digest(given.encode(), secret.encode())
