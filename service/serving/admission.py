"""Requests that can never be served within their deadline are refused when they arrive, not after it.

A request's decoding work is the tokens it may generate, every beam hypothesis counted: Σ texts × beam ×
max_length. One decoding thread generates at least ``decode_rate`` tokens a second with a full batch, so a request
asking for more than ``request_timeout_s × decode_rate`` would miss its deadline even alone on the server.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.decoding import DecodeRequest
from service.errors import TooLarge
from service.settings import Settings


def generated_tokens(request: DecodeRequest) -> int:
    """The most tokens a text's decoding generates: a forced target once, else each beam hypothesis up to
    ``max_length``."""
    if request.forced is not None:
        return len(request.forced)
    return request.beam_size * request.max_length


def check_servable(requests: Sequence[DecodeRequest], settings: Settings) -> None:
    """Refuse the texts of one request if their decoding cannot end within the deadline.

    Raises:
        TooLarge: more than ``request_timeout_s × decode_rate`` generated tokens at most.
    """
    work = sum(generated_tokens(r) for r in requests)
    allowed = int(settings.request_timeout_s * settings.decode_rate)
    if work > allowed:
        raise TooLarge(
            f"the request may generate {work} tokens (texts × beam_size × max_length); within request_timeout_s="
            f"{settings.request_timeout_s:g} at decode_rate={settings.decode_rate:g} tokens/s the limit is "
            f"{allowed}: send fewer texts, or lower beam_size or max_length",
            "decode_rate",
            allowed,
        )
