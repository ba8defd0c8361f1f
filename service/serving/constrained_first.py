"""Whether a pair's segments with spans decode under the stand-in constraint from the start.

A model that copies its stand-ins needs no constraint: its first decode is whole, and a constrained first decode
would only cost it the graph's greedy tokens. A model that breaks them (weakly trained, or far from its data) would
decode most such segments twice, the second time constrained (service/serving/restoring.py). The engine counts how
the pair's unconstrained first decodes come out and, while most come out broken, asks for the constrained decode at
once; every :data:`PROBE`-th segment still decodes unconstrained first, so the count follows the model's texts.
"""

from __future__ import annotations

PROBE = 8  # while constrained first, one segment in PROBE decodes unconstrained first
WEIGHT = 0.1  # of one segment's outcome in the running share
SEEN = 8  # outcomes counted before the share may switch
SHARE = 0.5  # of broken first decodes above which segments decode constrained first


class ConstrainedFirst:
    """The running share of a pair's unconstrained first decodes of segments with spans that came out broken."""

    def __init__(self) -> None:
        self.share = 0.0
        self.seen = 0
        self.asked = 0

    def now(self) -> bool:
        """Whether the next segment with spans decodes constrained from the start."""
        self.asked += 1
        return self.seen >= SEEN and self.share > SHARE and self.asked % PROBE != 0

    def record(self, broken: bool) -> None:
        """An unconstrained first decode of a segment with spans came out ``broken`` (it needed recovery)."""
        self.seen += 1
        self.share += WEIGHT * (broken - self.share)
