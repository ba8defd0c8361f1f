"""Greedy steps on a fast decoder that gives greedy tokens: its own (``attnserve.GreedyTokens``, an int8 screen of the
vocabulary and float32 logits for the tokens it cannot rule out) or every row's logits and the argmax on the host,
whichever has cost less a row lately at about the step's number of rows, measured step by step.

The screen wins where the model is sure of the next token. Where it is not (flat logits) the screen admits much of
the vocabulary and ends up computing the whole float32 product, which the logits' MatMul computes faster and without
the int8 product before it. Both give each row's float32 argmax, padding left out, the first of equal logits.

A step also costs what does not grow with its rows, so a row costs more in a step of few rows: each mode's cost is
kept by the step's size (its rows' power of two), and a step compares the modes at its own size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE = 32  # steps in one mode between steps of the other, so that the other's cost is known and kept current
WEIGHT = 0.25  # of a new step's cost in a mode's running cost
# How many times less a row the other mode must cost before steps turn to it: single steps' noise does not swing it.
MARGIN = 1.1


def size(rows: int) -> int:
    """A step's size class: 1 row, 2-3, 4-7, 8-15, ..."""
    return max(rows, 1).bit_length()


@dataclass
class GreedyChoice:
    """The mode of each greedy step (True: the graph's greedy tokens) and what each mode costs a row lately, by the
    step's size."""

    cost: dict[tuple[int, bool], float] = field(default_factory=dict)  # seconds a row, by (size, mode)
    steps: int = 0
    mode: dict[int, bool] = field(default_factory=dict)  # by size: the mode steps take between probes

    def tokens(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows asks for greedy tokens: the mode of its size (greedy tokens at first),
        turned to the other once that costs MARGIN times less a row there, or the other every PROBE-th step."""
        self.steps += 1
        s = size(rows)
        mode = self.mode.get(s, True)
        now, other = self.cost.get((s, mode)), self.cost.get((s, not mode))
        if now is not None and other is not None and other * MARGIN < now:
            mode = self.mode[s] = not mode
        return mode != (self.steps % PROBE == 0)

    def record(self, tokens: bool, seconds: float, rows: int) -> None:
        """A greedy step of ``rows`` rows in mode ``tokens`` took ``seconds``."""
        key, now = (size(rows), tokens), seconds / max(rows, 1)
        before = self.cost.get(key)
        self.cost[key] = now if before is None else before + WEIGHT * (now - before)
