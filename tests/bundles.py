"""Tiny random bundles, so that no test needs a trained model.

``python -m tests.bundles`` writes the committed ones (tests/fixtures/), which the service's tests use without torch;
tests/model/export/test_bundle.py checks they are what the exporter writes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from model.export.bundle import export_bundle
from model.export.quantize import add_int8
from model.tokenizer import train_sentencepiece
from model.transformer import Transformer, TransformerConfig, make_model
from tests.conftest import FIXTURES, TINY, TINY_INT8

SENTENCES = [
    "Open file",
    "Save as…",
    "Delete the selected files?",
    "Settings",
    "Could not open %s: permission denied",
    "The file {0} already exists. Replace it?",
    "ファイルを開く",
    "名前を付けて保存…",
    "選択したファイルを削除しますか?",
    "設定",
    "%s を開けませんでした: アクセスが拒否されました",
    "ファイル {0} は既に存在します。置き換えますか?",
    "Print the current document",
    "現在のドキュメントを印刷します",
    "Close window",
    "ウィンドウを閉じる",
]


def tiny_spm(out_dir: Path, vocab_size: int = 380) -> Path:
    """A joint SentencePiece model in Marian's layout (</s> 0, <unk> 1, <pad> last) from the sentences above."""
    prefix = out_dir / "tiny"
    train_sentencepiece(SENTENCES * 20, prefix, vocab_size=vocab_size)
    return prefix.with_suffix(".model")


def tiny_model(vocab_size: int, seed: int = 0, **overrides: Any) -> Transformer:
    """A random model whose outputs depend on the input and sometimes end: matrices scaled up from their
    initialization (else every output repeats one token), and a random final logits bias."""
    config = TransformerConfig(
        vocab_size=vocab_size,
        pad_id=vocab_size - 1,
        decoder_start_id=vocab_size - 1,
        final_logits_bias=True,
        **{
            "d_model": 32,
            "h": 4,
            "d_ff": 64,
            "n_encoder_layers": 2,
            "n_decoder_layers": 2,
            "max_positions": 128,
            **overrides,
        },
    )
    torch.manual_seed(seed)
    model = make_model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
        bias = model.generator.final_logits_bias
        assert bias is not None
        bias.normal_(0.0, 1.0)
    return model


def make_tiny_bundle(out_dir: Path, work_dir: Path, seed: int = 0, **overrides: Any) -> Path:
    """Export a tiny random model with a tiny tokenizer as a bundle at ``out_dir``."""
    spm = tiny_spm(work_dir)
    size = sum(1 for _ in spm.with_suffix(".vocab").open(encoding="utf-8"))
    model = tiny_model(size, seed, **overrides)
    return export_bundle(
        model,
        out_dir,
        name="tiny-en-ja",
        source_lang="en",
        target_lang="ja",
        tokenizer={"source": spm, "target": spm},
        provenance={"note": "random weights, for tests"},
    )


def write_fixtures(out_dir: Path, work_dir: Path) -> None:
    """Write the committed tiny bundles into ``out_dir``: float32, and the same with the int8 variant."""
    out_dir = out_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(work_dir):  # spm.model records its training prefix: a relative one keeps it byte-identical
        make_tiny_bundle(out_dir / TINY, Path())
        add_int8(make_tiny_bundle(out_dir / TINY_INT8, Path()))


if __name__ == "__main__":
    import shutil
    import tempfile

    for name in (TINY, TINY_INT8):
        shutil.rmtree(FIXTURES / name, ignore_errors=True)
    with tempfile.TemporaryDirectory() as work:
        write_fixtures(FIXTURES, Path(work))
