"""Per-client limits, as LibreTranslate has them: requests and characters a minute per API key (or per client address
without keys), characters per request.

Rates are token buckets in GCRA form (one float a client and rate): a bucket holds a minute's allowance and refills
continuously, so a client may spend its minute at once and then earns it back evenly, and the wait until a request
fits is exact (``Retry-After``). Written here rather than taken from ``limits``: its in-memory moving window keeps one
entry per unit of cost, which a characters-a-minute limit would make tens of thousands of entries a client.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import Request

from service.http.auth import given_key
from service.http.errors import Forbidden, KeyLimitExceeded, RateLimited
from service.http.keys import KeyLimits, Keys
from service.settings import Settings

MINUTE = 60.0
PRUNE_AT = 4096  # clients held before the buckets that are full again are dropped


class Buckets:
    """Token buckets by client for one kind of unit (requests or characters), each holding a minute's allowance.

    GCRA: a client's state is the time its bucket will be full again (``full_at``); taking ``cost`` units of an
    allowance of ``per_minute`` moves it ``cost * 60 / per_minute`` seconds later, and is refused when that would
    put it more than a minute ahead of now.
    """

    def __init__(self) -> None:
        self.full_at: dict[str, float] = {}
        self.prune_at = PRUNE_AT

    def wait(self, client: str, cost: int, per_minute: int, now: float) -> float:
        """Seconds until ``cost`` units fit in the client's bucket (0: they fit now); takes nothing."""
        after = max(self.full_at.get(client, now), now) + cost * MINUTE / per_minute
        return max(0.0, after - now - MINUTE)

    def take(self, client: str, cost: int, per_minute: int, now: float) -> None:
        """Take ``cost`` units (after :meth:`wait` said they fit)."""
        self.full_at[client] = max(self.full_at.get(client, now), now) + cost * MINUTE / per_minute
        if len(self.full_at) > self.prune_at:
            self.full_at = {c: t for c, t in self.full_at.items() if t > now}  # a full bucket is no bucket
            self.prune_at = max(PRUNE_AT, 2 * len(self.full_at))


@dataclass(frozen=True)
class Client:
    """Who sends a request, as the limits count it: ``key:<key>`` or ``addr:<address>``, its limits, and how a
    refusal names them."""

    name: str
    limits: KeyLimits
    whose: str


class Admission:
    """Who may send a request to /translate, /attention, /detect and /translate_file: the API key check and the
    per-client limits (docs/API.md, "API keys and per-client limits").

    Built once for the app; :meth:`check` is one attribute test when no keys and no anonymous limit are set.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.keys = Keys(settings.api_keys, settings.api_keys_file)
        self.anonymous = KeyLimits(requests_per_minute=settings.requests_per_minute)
        self.active = self.keys.configured or settings.requests_per_minute is not None
        self.requests, self.chars = Buckets(), Buckets()
        self.clock = clock

    def check(self, request: Request, body_key: str | None, texts: str | Sequence[str]) -> None:
        """Admit a request of ``texts`` or refuse it; a list of n texts counts n requests (LibreTranslate's rule).

        Raises:
            Forbidden: keys are configured and the request has none of them.
            KeyLimitExceeded: the request alone is over a limit of its client (characters per request, or more
                requests or characters than a minute allows).
            RateLimited: the client's requests or characters a minute are spent for now.
        """
        if not self.active:
            return
        one = isinstance(texts, str)
        cost, chars = 1 if one else max(1, len(texts)), len(texts) if one else sum(len(t) for t in texts)
        self.charge(self.client(request, body_key), cost, chars)

    def client(self, request: Request, body_key: str | None) -> Client | None:
        """The request's client, its key checked; None when neither keys nor an anonymous limit are set.

        Raises:
            Forbidden: keys are configured and the request has none of them.
        """
        if not self.active:
            return None
        if not self.keys.configured:
            address = request.client.host if request.client else ""
            return Client("addr:" + address, self.anonymous, "this client address's")
        given = given_key(request, body_key) or ""
        found = self.keys.lookup(given) if given else None
        if found is None:
            what = "a wrong API key" if given else "no API key"
            raise Forbidden(f"{what}: send a valid key as 'api_key' or 'Authorization: Bearer <key>'")
        return Client("key:" + given, found, "this API key's")

    def charge(self, client: Client | None, cost: int, chars: int) -> None:
        """Take ``cost`` requests and ``chars`` characters from ``client``'s allowance, or refuse them all (a
        request, or a file's texts once they are known).

        Raises:
            KeyLimitExceeded, RateLimited: as :meth:`check`.
        """
        if client is None:
            return
        limits, whose = client.limits, client.whose
        _check_sizes(limits, whose, cost, chars)
        now = self.clock()
        rates = [
            (self.requests, limits.requests_per_minute, cost, "requests_per_minute"),
            (self.chars, limits.chars_per_minute, chars, "chars_per_minute"),
        ]
        for buckets, per_minute, units, field in rates:
            if per_minute is not None and (wait := buckets.wait(client.name, units, per_minute, now)) > 0:
                retry = math.ceil(wait)
                raise RateLimited(f"over {whose} {field}={per_minute}; retry in {retry} s", retry)
        for buckets, per_minute, units, _ in rates:
            if per_minute is not None:
                buckets.take(client.name, units, per_minute, now)


def _check_sizes(limits: KeyLimits, whose: str, cost: int, chars: int) -> None:
    """Refuse a request that no wait would let through."""
    checks = (
        ("chars_per_request", limits.chars_per_request, chars, f"{chars} characters in one request"),
        ("requests_per_minute", limits.requests_per_minute, cost, f"{cost} texts in one request count {cost} requests"),
        ("chars_per_minute", limits.chars_per_minute, chars, f"{chars} characters in one request"),
    )
    for field, limit, value, what in checks:
        if limit is not None and value > limit:
            raise KeyLimitExceeded(f"{what}; {whose} limit is {field}={limit}", field, limit)
