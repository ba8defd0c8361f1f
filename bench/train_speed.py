"""Training throughput on this machine: float32, bfloat16 autocast and torch.compile (target tokens per second).

python bench/train_speed.py --corpus ~/.cache/attnserve/corpus/en-ja --steps 30
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import sentencepiece as spm
import torch

from model.data import read_pairs
from model.train import DEFAULT_MODEL, TrainConfig, Trainer, encode_pairs
from model.transformer import TransformerConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=6000)
    args = ap.parse_args()
    sp = spm.SentencePieceProcessor(model_file=str(args.corpus / "spm.model"))
    c = TransformerConfig(
        vocab_size=sp.get_piece_size(), pad_id=sp.pad_id(), decoder_start_id=sp.pad_id(), **DEFAULT_MODEL
    )
    data = encode_pairs(sp, read_pairs(args.corpus / "dev.tsv") + read_pairs(args.corpus / "test.tsv"), c.eos_id, 128)
    base = TrainConfig(max_tokens=args.max_tokens)
    n_params = sum(p.numel() for p in Trainer(c, base, data, Path(tempfile.mkdtemp())).model.parameters())
    print(f"threads {torch.get_num_threads()}, {n_params:,} parameters")
    variants = (
        ("float32", base, False),
        ("bf16 autocast", replace(base, bf16=True), False),
        ("torch.compile", base, True),
    )
    for name, t, compiled in variants:
        trainer = Trainer(c, t, data, Path(tempfile.mkdtemp()))
        if compiled:  # dynamic shapes: every batch has another (B, S, T)
            trainer.model.forward = torch.compile(trainer.model.forward, dynamic=True)  # type: ignore[method-assign]
        batches = trainer.epoch_batches()
        t0 = time.perf_counter()
        for b in batches[-3:]:  # warm-up (and compilation) on batches not timed
            trainer.train_step(data.collate(b, c))
        print(f"{name:14s} warm-up {time.perf_counter() - t0:6.1f} s")
        tokens, t0 = 0, time.perf_counter()
        for b in batches[1 : args.steps + 1]:
            tokens += trainer.train_step(data.collate(b, c))[1]
        print(f"{name:14s} {tokens / (time.perf_counter() - t0):8.0f} target tokens/s")


if __name__ == "__main__":
    main()
