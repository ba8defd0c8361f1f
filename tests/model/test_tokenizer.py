"""Tests of model/tokenizer.py: a tiny joint English/Japanese SentencePiece model with the Marian id layout."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sentencepiece as spm

from model.tokenizer import (
    EOS_ID,
    UNK_ID,
    tokenizer_stats,
    train_corpus_tokenizer,
    train_sentencepiece,
)

# Byte fallback reserves 256 ids (and </s>, <unk>, <pad> three more), so the smallest useful vocabulary is ~300.
VOCAB = 320
EN_WORDS = [
    "open",
    "close",
    "save",
    "the",
    "file",
    "window",
    "new",
    "folder",
    "delete",
    "copy",
    "paste",
    "print",
    "settings",
    "show",
    "hide",
    "all",
    "selected",
]
JA_WORDS = [
    "ファイル",
    "を",
    "開く",
    "閉じる",
    "保存",
    "新しい",
    "フォルダー",
    "削除",
    "コピー",
    "貼り付け",
    "印刷",
    "設定",
    "表示",
    "すべて",
    "選択",
    "した",
]


def synthetic_lines(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        words = EN_WORDS if i % 2 == 0 else JA_WORDS
        joiner = " " if i % 2 == 0 else ""
        lines.append(joiner.join(rng.choice(words) for _ in range(rng.randint(2, 8))) + rng.choice(["", ".", "。"]))
    return lines


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_sentencepiece(synthetic_lines(), tmp_path_factory.mktemp("spm") / "tiny", VOCAB, num_threads=1)


def test_marian_special_token_layout(model: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert sp.get_piece_size() == VOCAB
    assert (sp.id_to_piece(0), sp.eos_id()) == ("</s>", EOS_ID)
    assert (sp.id_to_piece(1), sp.unk_id()) == ("<unk>", UNK_ID)
    assert sp.bos_id() == -1
    assert (sp.id_to_piece(VOCAB - 1), sp.pad_id()) == ("<pad>", VOCAB - 1)
    assert model.with_suffix(".vocab").exists()


@pytest.mark.parametrize("text", ["open the file 😀", "ファイルを開く（テスト）", "Tab\u3000全角スペース ｶﾅ", "Ω≈ç√ 𝔘"])
def test_byte_fallback_round_trip_without_unk(model: Path, text: str) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    ids = sp.encode(text)
    assert UNK_ID not in ids
    assert sp.decode(ids) == text


def test_unseen_character_becomes_bytes(model: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    pieces = sp.encode("😀", out_type=str)
    assert [p for p in pieces if p.startswith("<0x")] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


def test_training_is_deterministic(tmp_path: Path) -> None:
    first = train_sentencepiece(synthetic_lines(), tmp_path / "m", VOCAB, num_threads=2).read_bytes()
    second = train_sentencepiece(synthetic_lines(), tmp_path / "m", VOCAB, num_threads=2).read_bytes()
    assert first == second


def test_vocab_too_small_for_byte_fallback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="byte fallback"):
        train_sentencepiece(synthetic_lines(), tmp_path / "m", 100)


def test_stats_and_corpus_training(tmp_path: Path) -> None:
    lines = synthetic_lines()
    rows = [f"{en}\t{ja}\tpkg\n" for en, ja in zip(lines[::2], lines[1::2], strict=True)]
    (tmp_path / "train.tsv").write_text("".join(rows), encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("open the file 😀\tファイルを開く\tpkg\n", encoding="utf-8")
    result = train_corpus_tokenizer(tmp_path, vocab_size=VOCAB, num_threads=1)
    assert (tmp_path / "spm.model").exists()
    stats = result["dev"]
    assert stats["sentences"] == 1 and stats["unk_pieces"] == 0
    assert stats["pieces_per_sentence"]["source"] >= 4  # ▁open ▁the ▁file ▁ + 4 bytes of the emoji
    assert 0 < stats["byte_fallback_fraction"]["source"] < 1
    assert stats["byte_fallback_fraction"]["target"] == 0

    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    assert tokenizer_stats(sp, [])["sentences"] == 0
