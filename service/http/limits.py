"""The per-request limits of the settings that a route checks before it calls the engine (the engine checks
those that need the tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence

from service.errors import OptionOverLimit, TooLarge
from service.http.errors import InvalidField
from service.serving.translation import Options
from service.settings import Settings


def check_texts(settings: Settings, texts: Sequence[str]) -> None:
    """Raises InvalidField for no text, TooLarge for more than ``max_texts``."""
    if not texts:
        raise InvalidField("q is an empty list; send at least one text")
    if len(texts) > settings.max_texts:
        raise TooLarge(
            f"{len(texts)} texts in one request; the limit is max_texts={settings.max_texts}",
            "max_texts",
            settings.max_texts,
        )


def check_options(settings: Settings, options: Options) -> None:
    """Raises OptionOverLimit for a beam asked for (widened for the alternatives) or a max_length over the settings';
    InvalidField for ``raw`` with glossary or kept terms (which need masking)."""
    s = settings
    if options.raw and (options.glossary or options.keep):
        raise InvalidField("raw: the text goes to the model as given, and glossary and keep need masking; send one")
    beam = max(options.beam_size or 1, options.alternatives + 1)
    if beam > s.max_beam_size:
        raise OptionOverLimit(
            f"beam_size={beam} is over the limit max_beam_size={s.max_beam_size}", "max_beam_size", s.max_beam_size
        )
    if options.max_length is not None and options.max_length > s.max_length:
        raise OptionOverLimit(
            f"max_length={options.max_length} is over the limit max_length={s.max_length}", "max_length", s.max_length
        )
