"""What storing a bundle's weights as float16 costs: size on disk, start-up time (bundle checked and loaded, ONNX
Runtime sessions built, one text decoded) and greedy tokens against the same weights stored as float32, for a tiny
and a tc-big-shaped random model (d_model 1024, 16 heads, d_ff 4096, ReLU, 1024 positions).

    python bench/storage.py [--layers 2] [--rounds 3]

Both bundles hold the same float16 values (a float16 checkpoint's), so the tokens must be identical; the table is
printed in docs/BENCHMARKS.md's form.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import FALLBACK

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.export import export_bundle
from model.transformer import Transformer, TransformerConfig
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.runner import Runner
from tests.bundles import tiny_spm

SHAPES = {
    "tiny": {"d_model": 32, "h": 4, "d_ff": 64, "activation": "swish", "max_positions": 128},
    "tc-big-shaped": {"d_model": 1024, "h": 16, "d_ff": 4096, "activation": "relu", "max_positions": 1024},
}


def model(vocab: int, layers: int, shape: dict[str, object]) -> Transformer:
    """A random model whose weights are float16 values, as a float16 checkpoint's are."""
    config = TransformerConfig(vocab_size=vocab, pad_id=vocab - 1, decoder_start_id=vocab - 1, final_logits_bias=True,
                               n_encoder_layers=layers, n_decoder_layers=layers, **shape)  # type: ignore[arg-type]  # fmt: skip
    torch.manual_seed(0)
    m = Transformer(config).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_((p * 3).half().float())
    return m


def start_up(bundle_dir: Path) -> tuple[float, list[list[int]]]:
    """Seconds from nothing loaded to one text decoded, and every fallback text's greedy tokens."""
    began = time.perf_counter()
    bundle = load_bundle(bundle_dir)
    runner = Runner(bundle, "cpu")
    decode(runner, [DecodeRequest(src=bundle.tokenizer.encode_source(FALLBACK[0]), max_length=4)])
    seconds = time.perf_counter() - began
    requests = [DecodeRequest(src=bundle.tokenizer.encode_source(t), max_length=32) for t in FALLBACK]
    return seconds, [r.hypotheses[0].tokens for r in decode(runner, requests)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers of each model")
    parser.add_argument("--rounds", type=int, default=3, help="start-ups timed per bundle (the median is shown)")
    args = parser.parse_args()
    print("| model | stored | weights.bin | start-up (median) | greedy tokens as float32's |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spm = tiny_spm(work)
        vocab = sum(1 for _ in spm.with_suffix(".vocab").open(encoding="utf-8"))
        for name, shape in SHAPES.items():
            m = model(vocab, args.layers, shape)
            tokens: dict[bool, list[list[int]]] = {}
            for float16 in (False, True):
                out = export_bundle(m, work / f"{name}-{float16}", name=name, source_lang="en", target_lang="ja",
                                    tokenizer={"source": spm, "target": spm}, float16=float16)  # fmt: skip
                times = []
                for _ in range(args.rounds):
                    seconds, tokens[float16] = start_up(out)
                    times.append(seconds)
                size = (out / "weights.bin").stat().st_size / 2**20
                same = sum(a == b for a, b in zip(tokens[False], tokens[float16], strict=True))
                stored = "float16" if float16 else "float32"
                print(f"| {name}, {args.layers}+{args.layers} layers | {stored} | {size:.1f} MiB | "
                      f"{sorted(times)[len(times) // 2]:.2f} s | {same}/{len(FALLBACK)} |")  # fmt: skip


if __name__ == "__main__":
    main()
