"""The service's domain errors: what a request asks that the service cannot do, each message saying how to fix it.

They know nothing of HTTP; service/http/errors.py maps each to a status code.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A request the service refuses; the message says what is wrong and how to fix it."""


class UnknownPair(ServiceError):
    """No served model translates the requested language pair."""


class AmbiguousSource(ServiceError):
    """``source="auto"`` while several served pairs translate into the target."""


class OverLimit(ServiceError):
    """A request goes past one of the service's limits.

    Attributes:
        field: the setting that sets the limit (``max_chars``, ``max_beam_size``, ...).
        limit: its value.
    """

    def __init__(self, message: str, field: str, limit: int) -> None:
        super().__init__(message)
        self.field = field
        self.limit = limit


class TooLarge(OverLimit):
    """An input is larger than a limit allows: characters, tokens, texts or body bytes."""


class OptionOverLimit(OverLimit):
    """A decoding option asks for more than the server allows (beam size, generated length)."""


class NoSuchIndex(ServiceError):
    """An attention filter names a layer or head that the model does not have."""


class LayoutMismatch(ServiceError):
    """A forced target text (``target_text``) is not laid out as its source: another number of lines with text, or
    of sentences on a line that the source's layout cuts into sentences."""


class ClientGone(Exception):
    """The caller went away before its answer was ready; its texts' rows were freed."""


class UnreadableFile(ServiceError):
    """A file to translate that cannot be read as its format says: not UTF-8 text, not a gettext catalog, or a
    catalog of another language than the target."""


class NoSuchFile(ServiceError):
    """A translated file that does not exist (or no longer does: stored files expire)."""


class InvalidText(ServiceError):
    """A text the tokenizer cannot take (not valid Unicode: an unpaired surrogate).

    Attributes:
        field: the request field that holds it (``q`` or ``target_text``).
    """

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class NotReady(ServiceError):
    """The server is loading its bundles or shutting down: it takes no new work (retry shortly, or elsewhere)."""


class ModelsBusy(ServiceError):
    """A pair's bundle is not loaded, and loading it would pass ``models_memory_mb`` while every loaded bundle has
    requests in flight; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PairUnavailable(ServiceError):
    """A pair's bundle failed to load (ONNX Runtime refused a graph, the provider failed); retry, or ask another
    pair."""


class PivotOnly(ServiceError):
    """A request that a pair served through a pivot language cannot answer in one piece (/attention: each hop has
    its own weights); the message names the direct pairs to ask instead."""
