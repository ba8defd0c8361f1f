"""The decoder's contract with its callers: one text to decode (:class:`DecodeRequest`) and what comes back
(:class:`DecodeResult`, best :class:`Hypothesis` first)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.decoding.constraint import StandIns


@dataclass(frozen=True)
class DecodeRequest:
    """One text to decode.

    Args:
        src: source ids ending with </s>.
        beam_size: 1 = greedy.
        max_length: generated tokens at most (</s> and ``prefix`` included).
        length_penalty: finished beam hypotheses rank by score / length^length_penalty.
        n_best: hypotheses returned (≤ beam_size).
        forced: target ids (ending with </s>) to force-decode instead of searching.
        attention: collect encoder, decoder and cross attention.
        scores: compute each token's log-probability (the log-softmax over the vocabulary, every step). Beam
            search always does, to rank; without it, greedy and forced hypotheses have NaN scores.
        constraint: stand-ins the search must emit exactly once each (service/decoding/constraint.py); the
            tokens it forbids get no probability, and the others' log-probabilities are renormalized over them.
        prefix: target ids forced first, before ``forced`` or the search, as CTranslate2 forces a ``target_prefix``:
            each scores 0, they count in ``max_length`` and in the length that beam search's length penalty divides
            by, </s> ends nothing before their end, and the hypotheses come back without their tokens, scores and
            attention steps (a self-attention row keeps their positions among its keys).
        repetition_penalty: a generated token's logit is divided by this where positive and multiplied where
            negative, as transformers and CTranslate2 do (1: none; service/decoding/repetition.py).
        no_repeat_ngram_size: no n-gram of tokens twice (0: none).
    """

    src: list[int]
    beam_size: int = 1
    max_length: int = 64
    length_penalty: float = 1.0
    n_best: int = 1
    forced: list[int] | None = None
    attention: bool = False
    scores: bool = True
    constraint: StandIns | None = None
    prefix: tuple[int, ...] = ()
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    @property
    def adjusted(self) -> bool:
        """Whether its logits are adjusted before a token is chosen (a constraint or a repetition penalty)."""
        return self.constraint is not None or self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0


@dataclass
class Hypothesis:
    """One decoded target text."""

    tokens: list[int]  # generated ids, ending with </s> unless max_length cut it
    token_scores: list[float]  # log-probability of each token (NaN unless the request asked for scores)
    self_attention: list[np.ndarray] = field(default_factory=list)  # per step (L, h, t + 1)
    cross_attention: list[np.ndarray] = field(default_factory=list)  # per step (L, h, S)

    @property
    def score(self) -> float:
        """The summed log-probability of its tokens."""
        return float(sum(self.token_scores))

    def without_prefix(self, n: int) -> Hypothesis:
        """This hypothesis without its first n tokens (a forced prefix): their tokens, scores and attention steps."""
        return Hypothesis(self.tokens[n:], self.token_scores[n:], self.self_attention[n:], self.cross_attention[n:])


@dataclass
class DecodeResult:
    """A request's answer."""

    hypotheses: list[Hypothesis]  # best first
    encoder_attention: np.ndarray | None  # (L, h, S, S)
