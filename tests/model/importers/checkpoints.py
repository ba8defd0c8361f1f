"""Random MarianMTModel directories in each OPUS-MT layout, written as transformers writes them."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece
import torch
from transformers import MarianConfig, MarianMTModel

SPECIALS = ("</s>", "<unk>", "<pad>")


@dataclass(frozen=True)
class Layout:
    """One checkpoint layout: its shape, its vocabulary's order, its codes and how its weights are stored."""

    dir_name: str
    codes: tuple[str, str] | None  # tokenizer_config.json's source_lang/target_lang; None: only the directory says
    shape: dict[str, Any] = field(default_factory=dict)
    target_tokens: tuple[str, ...] = ()  # >>xxx<< pieces added to the vocabulary
    permuted: bool = False  # specials mid-table instead of </s> 0, <unk> 1, <pad> last
    float16: bool = False  # weights saved in float16
    seed: int = 0


TINY = {"d_model": 32, "heads": 4, "ffn": 64, "layers": (2, 3), "activation": "swish", "positions": 64}
TC_BIG = {"d_model": 1024, "heads": 16, "ffn": 1024, "layers": (1, 1), "activation": "relu", "positions": 1024}


def vocabulary(spm: Path, layout: Layout) -> dict[str, int]:
    """The SentencePiece model's pieces, then the target tokens; permuted, every id shuffled (specials land
    mid-table)."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    pieces = [p for p in pieces if p != "<pad>"] + list(layout.target_tokens) + ["<pad>"]
    if layout.permuted:
        random.Random(layout.seed).shuffle(pieces)
        assert all(0 < pieces.index(s) < len(pieces) - 1 for s in SPECIALS)
    return {p: i for i, p in enumerate(pieces)}


def random_marian(out_dir: Path, spm: Path, layout: Layout) -> Path:
    """A random MarianMTModel (tied embeddings, final logits bias) with opus-mt tokenizer files in ``layout``."""
    vocab = vocabulary(spm, layout)
    V, pad, s = len(vocab), vocab["<pad>"], {**TINY, **layout.shape}
    config = MarianConfig(
        vocab_size=V,
        decoder_vocab_size=V,
        d_model=s["d_model"],
        encoder_layers=s["layers"][0],
        decoder_layers=s["layers"][1],
        encoder_attention_heads=s["heads"],
        decoder_attention_heads=s["heads"],
        encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"],
        activation_function=s["activation"],
        max_position_embeddings=s["positions"],
        pad_token_id=pad,
        eos_token_id=vocab["</s>"],
        decoder_start_token_id=pad,
        bad_words_ids=[[pad]],
        forced_eos_token_id=None,
    )
    torch.manual_seed(layout.seed)
    model = MarianMTModel(config)
    scale = 0.3 * (32 / s["d_model"]) ** 0.5  # outputs depend on the input at any width
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, scale)
        model.model.shared.weight[pad].zero_()
        model.final_logits_bias.normal_(0.0, 1.0)
    (model.half() if layout.float16 else model).save_pretrained(out_dir)
    for role in ("source", "target"):
        shutil.copyfile(spm, out_dir / f"{role}.spm")
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tok_config = {} if layout.codes is None else {"source_lang": layout.codes[0], "target_lang": layout.codes[1]}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return out_dir
