"""Greedy steps on a fast decoder that gives greedy tokens: its own (``attnserve.GreedyTokens``, an int8 screen of the
vocabulary and float32 logits for the tokens it cannot rule out) or every row's logits and the argmax on the host,
whichever has cost less a row lately, measured step by step.

The screen wins where the model is sure of the next token. Where it is not (flat logits) the screen admits much of
the vocabulary and ends up computing the whole float32 product, which the logits' MatMul computes faster and without
the int8 product before it. Both give each row's float32 argmax, padding left out, the first of equal logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE = 32  # steps in one mode between steps of the other, so that the other's cost is known and kept current
WEIGHT = 0.25  # of a new step's cost in a mode's running cost


@dataclass
class GreedyChoice:
    """The mode of each greedy step (True: the graph's greedy tokens) and what each mode costs a row lately."""

    cost: dict[bool, float] = field(default_factory=dict)  # seconds a row, by mode
    steps: int = 0

    def tokens(self) -> bool:
        """Whether this step asks for greedy tokens: the cheaper mode, or the other every PROBE-th step (the one
        never measured first)."""
        self.steps += 1
        best = True if len(self.cost) < 2 else self.cost[True] <= self.cost[False]
        return best != (self.steps % PROBE == 0)

    def record(self, tokens: bool, seconds: float, rows: int) -> None:
        """A greedy step of ``rows`` rows in mode ``tokens`` took ``seconds``."""
        now = seconds / max(rows, 1)
        before = self.cost.get(tokens)
        self.cost[tokens] = now if before is None else before + WEIGHT * (now - before)
