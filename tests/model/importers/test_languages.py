"""Model codes -> LibreTranslate's codes, and a multi-target vocabulary's targets."""

from __future__ import annotations

import pytest

from model.importers.languages import served_code, served_targets


@pytest.mark.parametrize(
    ("model_code", "served"),
    [("en", "en"), ("eng", "en"), ("jpn", "ja"), ("deu", "de"), ("zho", "zh"), ("cmn_Hans", "zh"),
     ("zho_Hant", "zt"), ("fr_BE", "fr"), ("pt_br", "pt"), ("arb", "ar"), ("srp_Cyrl", "sr")],
)  # fmt: skip
def test_served_code(model_code: str, served: str) -> None:
    assert served_code(model_code) == served


@pytest.mark.parametrize("group", ["ROMANCE", "xx"])
def test_a_group_is_no_language(group: str) -> None:
    with pytest.raises(ValueError, match="not a language code"):
        served_code(group)


def test_one_target_a_served_code_least_specific_first() -> None:
    vocab = {"</s>": 0, ">>fr_BE<<": 1, ">>fra<<": 2, ">>cmn_Hans<<": 3, ">>zho_Hans<<": 4, ">>ROMANCE<<": 5, "x": 6}
    targets = served_targets(vocab)
    assert [(t.code, t.model_code, t.token_id) for t in targets] == [("fr", "fra", 2), ("zh", "zho_Hans", 4)]
    assert [t.code for t in served_targets(vocab, ["zh", "fra"])] == ["zh", "fr"]
    with pytest.raises(ValueError, match="--targets de"):
        served_targets(vocab, ["de"])
