"""What a checkpoint directory says of itself: special ids, codes, and the refusals when it contradicts itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.importers.layout import Specials, languages, special_ids

VOCAB = {"a": 0, "</s>": 7, "<unk>": 3, "<pad>": 5, ">>spa<<": 8, ">>ita<<": 9}


def test_special_ids_from_the_vocabulary() -> None:
    hf = {"eos_token_id": 7, "pad_token_id": 5, "decoder_start_token_id": 5}
    assert special_ids(hf, VOCAB, {}) == Specials(eos_id=7, unk_id=3, pad_id=5, decoder_start_id=5)


def test_a_config_that_contradicts_the_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match=r"eos_token_id=0, but vocab\.json puts"):
        special_ids({"eos_token_id": 0, "pad_token_id": 5}, VOCAB, {})


def test_codes_from_the_directory_name_and_overrides(tmp_path: Path) -> None:
    plain = {"a": 0, "</s>": 1}
    found = languages(tmp_path / "opus-mt-tc-big-eng-jpn", plain, {})
    assert (found.model_source, found.model_target, found.source, found.target) == ("eng", "jpn", "en", "ja")
    assert (
        languages(tmp_path / "x", plain, {"source_lang": "eng", "target_lang": "jpn"}, target_lang="jp").target == "jp"
    )
    with pytest.raises(ValueError, match="give --source-lang"):
        languages(tmp_path / "x", plain, {})


def test_a_multi_target_model_serves_its_tokens(tmp_path: Path) -> None:
    found = languages(tmp_path / "opus-mt-en-ROMANCE", VOCAB, {}, targets=["es"])
    assert (found.source, found.target, [t.code for t in found.targets]) == ("en", "ROMANCE", ["es"])
    with pytest.raises(ValueError, match="--targets"):
        languages(tmp_path / "opus-mt-en-de", {"a": 0}, {}, targets=["de"])
