"""Language codes as OPUS-MT models spell them (``en``, ``eng``, ``zho_Hant``, ``pt_br``) -> the codes LibreTranslate
clients send (``en``, ``zh``, ``zt``, ``pt``), and a multi-target model's ``>>xxx<<`` target tokens.

The table is langcodes' (the IANA subtag registry with ISO 639-3 and its macrolanguages), not ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import langcodes

TARGET_TOKEN = re.compile(r"^>>(.+)<<$")  # MarianTokenizer's language_code_re, anchored to a whole piece


@dataclass(frozen=True)
class Target:
    """One target a multi-target model serves: its served code, the model's code and its token's one id."""

    code: str  # what clients send (``fr``)
    model_code: str  # as the vocabulary spells it (``fra``)
    token: str  # ``>>fra<<``
    token_id: int

    def to_manifest(self) -> dict[str, object]:
        """The manifest's ``targets`` entry: the source prefix is the token's id."""
        return {"code": self.code, "model_code": self.model_code, "prefix": [self.token_id]}


def _language(model_code: str) -> langcodes.Language:
    """langcodes' reading of a code, macrolanguages folded (``cmn`` -> ``zh``, ``arb`` -> ``ar``).

    Raises:
        ValueError: not a language code langcodes knows.
    """
    import langcodes  # the importers' alone: bench/gpu.py reaches this module on a machine without it

    try:
        language = langcodes.Language.get(langcodes.standardize_tag(model_code.replace("_", "-"), macro=True))
    except (ValueError, langcodes.tag_parser.LanguageTagError) as e:
        raise ValueError(f"{model_code!r} is not a language code: {e}") from None
    if language.language is None or not language.is_valid():
        raise ValueError(f"{model_code!r} is not a language code")
    return language


def served_code(model_code: str) -> str:
    """The code LibreTranslate clients send for a model's language code: ISO 639-1 where the language has one,
    else its ISO 639-3 code; Chinese in traditional script is ``zt``, as in LibreTranslate's and Argos' lists.

    Raises:
        ValueError: ``model_code`` is not a language code (a group such as ``ROMANCE``).
    """
    language = _language(model_code)
    if language.language == "zh" and (language.script == "Hant" or language.territory in ("TW", "HK", "MO")):
        return "zt"
    return str(language.language)


def _specificity(model_code: str) -> tuple[bool, bool]:
    """Sorts a served code's candidates: a bare language (``fra``) before a regional one (``fr_BE``), the
    macrolanguage's own code (``zho_Hans``) before one of its members (``cmn_Hans``)."""
    import langcodes

    language = _language(model_code)
    plain = langcodes.Language.get(langcodes.standardize_tag(model_code.replace("_", "-")))
    return language.territory is not None, plain.language != language.language


def target_tokens(vocab: dict[str, int]) -> list[tuple[str, str, int]]:
    """The vocabulary's ``>>xxx<<`` pieces as (model code, piece, id), in id order."""
    found = [(m.group(1), piece, i) for piece, i in vocab.items() if (m := TARGET_TOKEN.match(piece))]
    return sorted(found, key=lambda t: t[2])


def served_targets(vocab: dict[str, int], only: list[str] | None = None) -> list[Target]:
    """Every target a multi-target model's vocabulary has a token for, one per served code: where several tokens
    give one code, the least specific (:func:`_specificity`), then the lowest id. Tokens that name no language
    are left out.

    Args:
        vocab: piece -> id.
        only: keep these targets (served or model codes), in this order.

    Raises:
        ValueError: ``only`` names a target the vocabulary has no token for.
    """
    best: dict[str, tuple[tuple[bool, bool], Target]] = {}
    for model_code, piece, token_id in target_tokens(vocab):
        try:
            target = Target(served_code(model_code), model_code, piece, token_id)
        except ValueError:
            continue
        rank = _specificity(model_code)
        if target.code not in best or rank < best[target.code][0]:
            best[target.code] = (rank, target)
    targets = sorted((t for _, t in best.values()), key=lambda t: t.code)
    if only is None:
        return targets
    by_code = {t.code: t for t in targets} | {t.model_code: t for _, t in best.values()}
    missing = [c for c in only if c not in by_code]
    if missing:
        have = ", ".join(f"{t.code} ({t.model_code})" for t in targets)
        raise ValueError(f"--targets {','.join(missing)}: the model has no target token for it; it has {have}")
    return list({by_code[c].code: by_code[c] for c in only}.values())
