"""A joint SentencePiece tokenizer with Marian's (opus-mt's) special-token layout.

One unigram model covers both languages, so the source and target embeddings and the pre-softmax projection can share
one matrix (the paper, §3.4). The ids follow opus-mt: ``</s>`` = 0, ``<unk>`` = 1, no ``<s>``, and ``<pad>`` = the
last id (``vocab_size - 1``), whose embedding row stays zero; CTranslate2's Marian converter relies on that layout.
SentencePiece accepts ``pad_id = vocab_size - 1`` directly: the trainer places each special piece at the id it is
given and fills the other ids with learned pieces, so no user-defined symbol is needed (checked after training).

Byte fallback is on: a character outside the vocabulary (an emoji, a rare kanji) becomes its UTF-8 bytes
(``<0xF0>`` ...), so nothing is encoded as ``<unk>``. The 256 byte pieces take ids 2-257, so a vocabulary must have
more than 259 entries.

Normalization is ``identity`` rather than SentencePiece's default NFKC: decoding gives back exactly the text that was
encoded (full-width "（" and "：" in Japanese stay full-width); the corpus is NFC-normalized when it is built.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from model.data import read_tsv

LOG = logging.getLogger(__name__)

EOS_ID = 0
UNK_ID = 1
SPECIAL_PIECES = 3  # </s>, <unk>, <pad>
BYTE_PIECES = 256


def train_sentencepiece(
    texts: Iterable[str],
    model_prefix: Path,
    vocab_size: int = 8000,
    *,
    character_coverage: float = 0.9995,
    num_threads: int = 2,
    seed: int = 0,
    input_sentence_size: int = 0,
    normalization_rule_name: str = "identity",
) -> Path:
    """Train a joint unigram SentencePiece model with the Marian special-token layout.

    Training is deterministic for the same texts in the same order and the same ``num_threads``: the unigram
    trainer splits sentences among threads by position and sums their counts in thread order, and the random
    generator (used only to sample when ``input_sentence_size`` is set) is seeded. The model file also records
    ``model_prefix``, so the same prefix is needed for byte-identical files.

    Args:
        texts: Training sentences, one per item, no newlines; both languages (training split only, never dev/test).
        model_prefix: Writes ``<prefix>.model`` and ``<prefix>.vocab``.
        vocab_size: Number of ids, special and byte pieces included; more than 259.
        character_coverage: Fraction of characters that get their own piece; the rarest others fall back to bytes.
        num_threads: Training threads (fixed, for reproducibility).
        seed: Seed of SentencePiece's random generator.
        input_sentence_size: Sample this many sentences (0: use all); sampling shuffles with the seeded generator.
        normalization_rule_name: ``identity`` (exact round trip), or SentencePiece's ``nmt_nfkc``, ``nfkc``, ...

    Returns:
        The path of the ``.model`` file.

    Raises:
        ValueError: If ``vocab_size`` leaves no room for learned pieces.
        RuntimeError: If the trained model does not have the expected special-token layout, or SentencePiece cannot
            fill the vocabulary from the texts (too little text for ``vocab_size``).
    """
    if vocab_size <= SPECIAL_PIECES + BYTE_PIECES:
        raise ValueError(f"vocab_size={vocab_size} must exceed {SPECIAL_PIECES + BYTE_PIECES} (byte fallback)")
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(model_prefix),
        model_type="unigram",
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        byte_fallback=True,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        pad_id=vocab_size - 1,
        num_threads=num_threads,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=input_sentence_size > 0,
        normalization_rule_name=normalization_rule_name,
        max_sentence_length=8192,
        minloglevel=1,  # warnings only; SentencePiece logs every EM step at level 0
    )
    model_path = model_prefix.with_name(model_prefix.name + ".model")
    check_layout(spm.SentencePieceProcessor(model_file=str(model_path)), vocab_size)
    LOG.info("trained %s (%d pieces)", model_path, vocab_size)
    return model_path


def check_layout(sp: spm.SentencePieceProcessor, vocab_size: int) -> None:
    """Check the Marian layout: ``</s>`` = 0, ``<unk>`` = 1, no ``<s>``, ``<pad>`` = ``vocab_size - 1``.

    Raises:
        RuntimeError: If any of it does not hold.
    """
    expected = {
        "size": vocab_size,
        "eos": (EOS_ID, "</s>"),
        "unk": (UNK_ID, "<unk>"),
        "bos": -1,
        "pad": (vocab_size - 1, "<pad>"),
    }
    actual = {
        "size": sp.get_piece_size(),
        "eos": (sp.eos_id(), sp.id_to_piece(sp.eos_id())),
        "unk": (sp.unk_id(), sp.id_to_piece(sp.unk_id())),
        "bos": sp.bos_id(),
        "pad": (sp.pad_id(), sp.id_to_piece(sp.pad_id()) if sp.pad_id() >= 0 else None),
    }
    if actual != expected:
        raise RuntimeError(f"SentencePiece model layout {actual} differs from the Marian layout {expected}")


def tokenizer_stats(sp: spm.SentencePieceProcessor, pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """Pieces per sentence and the share of byte-fallback pieces, for each side of some pairs.

    Args:
        sp: The tokenizer.
        pairs: (source, target) texts, e.g. the dev split.

    Returns:
        ``{"sentences": n, "pieces_per_sentence": {"source": x, "target": y}, "byte_fallback_fraction": {"source",
        "target", "all"}, "unk_pieces": count}``.
    """
    sentences = 0
    pieces = {"source": 0, "target": 0}
    byte_pieces = {"source": 0, "target": 0}
    unk = 0
    for source, target in pairs:
        sentences += 1
        for side, text in (("source", source), ("target", target)):
            ids = sp.encode(text)
            pieces[side] += len(ids)
            byte_pieces[side] += sum(1 for i in ids if sp.is_byte(i))
            unk += sum(1 for i in ids if i == UNK_ID)
    total = pieces["source"] + pieces["target"]
    return {
        "sentences": sentences,
        "pieces_per_sentence": {side: round(pieces[side] / max(sentences, 1), 3) for side in pieces},
        "byte_fallback_fraction": {
            **{side: round(byte_pieces[side] / max(pieces[side], 1), 6) for side in pieces},
            "all": round(sum(byte_pieces.values()) / max(total, 1), 6),
        },
        "unk_pieces": unk,
    }


def _both_sides(rows: Iterable[tuple[str, str, str]]) -> Iterator[str]:
    for source, target, _ in rows:
        yield source
        yield target


def train_corpus_tokenizer(
    corpus_dir: Path, vocab_size: int = 8000, num_threads: int = 2, character_coverage: float = 0.9995
) -> dict[str, Any]:
    """Train ``<corpus_dir>/spm.model`` (+ ``.vocab``) on both sides of ``train.tsv`` and measure it on ``dev.tsv``.

    Called by ``python -m model.corpus build`` after the corpus is written (unless ``--no-spm``).

    Args:
        corpus_dir: A directory written by :func:`model.corpus.build`.
        vocab_size: Number of ids.
        num_threads: Training threads.
        character_coverage: 0.9995 suits a CJK language (the rarest kanji fall back to bytes); use 1.0 for
            alphabets, where the last 0.05 % of characters includes letters such as German "Ö".

    Returns:
        The training settings and :func:`tokenizer_stats` on the dev split.
    """
    model_path = train_sentencepiece(
        _both_sides(read_tsv(corpus_dir / "train.tsv")),
        corpus_dir / "spm",
        vocab_size,
        num_threads=num_threads,
        character_coverage=character_coverage,
    )
    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    stats = tokenizer_stats(sp, ((s, t) for s, t, _ in read_tsv(corpus_dir / "dev.tsv")))
    return {
        "model": model_path.name,
        "vocab_size": vocab_size,
        "model_type": "unigram",
        "normalization": "identity",
        "byte_fallback": True,
        "character_coverage": character_coverage,
        "ids": {"eos": EOS_ID, "unk": UNK_ID, "bos": None, "pad": vocab_size - 1},
        "trained_on": "train.tsv, source and target",
        "num_threads": num_threads,
        "dev": stats,
    }
