"""What storing a bundle's weights as float16 costs.

Random models: size on disk, start-up time (bundle checked and loaded, ONNX Runtime sessions built, one text
decoded) and greedy tokens against the same weights stored as float32, for a tiny and a tc-big-shaped random model
(d_model 1024, 16 heads, d_ff 4096, ReLU, 1024 positions). Both bundles hold the same float16 values (a float16
checkpoint's), so the tokens must be identical.

    python bench/storage.py [--layers 2] [--rounds 3]

A trained bundle stored as float32: exported again with its weights rounded to float16 (``attnserve export BUNDLE
OUT --store float16``), then both decode a test split, greedy and beam 4, on the float32 graphs /translate uses and
on the int8 ones: sentences whose tokens are identical, and chrF/BLEU of each (model/evaluate.py's scores).

    python bench/storage.py --bundle model/bundles/en-ja --corpus ~/.cache/attnserve/corpus/en-ja [--limit N]

Each prints its table in docs/BENCHMARKS.md's form.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import CORPUS, FALLBACK

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.data import read_pairs
from model.evaluate import decode_tokens, scores
from model.export.bundle import export_bundle
from model.export.reexport import export_from_bundle
from model.export.store import stored_float16
from model.transformer import Transformer, TransformerConfig
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.manifest import Manifest
from service.runtime.runner import Runner, open_runner
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
    runner = open_runner(bundle, "cpu")
    decode(runner, [DecodeRequest(src=bundle.tokenizer.encode_source(FALLBACK[0]), max_length=4)])
    seconds = time.perf_counter() - began
    requests = [DecodeRequest(src=bundle.tokenizer.encode_source(t), max_length=32) for t in FALLBACK]
    return seconds, [r.hypotheses[0].tokens for r in decode(runner, requests)]


def random_models(layers: int, rounds: int) -> None:
    """The table of the random models: each exported as float32 and as float16."""
    print("| model | stored | weights.bin | start-up (median) | greedy tokens as float32's |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spm = tiny_spm(work)
        vocab = sum(1 for _ in spm.with_suffix(".vocab").open(encoding="utf-8"))
        for name, shape in SHAPES.items():
            m = model(vocab, layers, shape)
            tokens: dict[bool, list[list[int]]] = {}
            for float16 in (False, True):
                out = export_bundle(m, work / f"{name}-{float16}", name=name, source_lang="en", target_lang="ja",
                                    tokenizer={"source": spm, "target": spm}, float16=float16)  # fmt: skip
                times = []
                for _ in range(rounds):
                    seconds, tokens[float16] = start_up(out)
                    times.append(seconds)
                size = (out / "weights.bin").stat().st_size / 2**20
                same = sum(a == b for a, b in zip(tokens[False], tokens[float16], strict=True))
                stored = "float16" if float16 else "float32"
                print(f"| {name}, {layers}+{layers} layers | {stored} | {size:.1f} MiB | "
                      f"{sorted(times)[len(times) // 2]:.2f} s | {same}/{len(FALLBACK)} |")  # fmt: skip


def runner(bundle: Bundle, variant: str) -> Runner:
    """What /translate decodes on: the fast float32 graphs, or the int8 ones."""
    return open_runner(bundle, "cpu", variant=variant, role="fast_decoder" if variant == "float32" else "decoder")


def stored_pair(source: Path, work: Path) -> dict[str, Bundle]:
    """The float32-stored bundle ``source`` (copied, its derived graphs written there) and its float16 re-store."""
    if stored_float16(source / Manifest.read(source).graphs["encoder"]):
        raise SystemExit(f"{source} stores its weights as float16 already; give its float32-stored form")
    copy = Path(shutil.copytree(source, work / "float32", ignore=shutil.ignore_patterns("*.int8.onnx")))
    restored = export_from_bundle(copy, work / "float16", float16=True)
    return {"float32": load_bundle(copy), "float16": load_bundle(restored)}


def trained_bundle(source: Path, corpus: Path, limit: int | None) -> None:
    """The table of a trained bundle against its float16 re-store on the test split (the first ``limit`` pairs)."""
    test = read_pairs(corpus / "test.tsv")[:limit]
    sources, refs = [s for s, _ in test], [t for _, t in test]
    with tempfile.TemporaryDirectory() as tmp:
        bundles = stored_pair(source, Path(tmp))
        sizes = {k: (b.path / "weights.bin").stat().st_size / 2**20 for k, b in bundles.items()}
        print(f"weights.bin: float32-stored {sizes['float32']:.1f} MiB, float16-stored {sizes['float16']:.1f} MiB; "
              f"{len(test)} test pairs\n")  # fmt: skip
        print("| graphs | decoding | tokens identical | chrF (float32 / float16 stored) | BLEU (float32 / float16) |")
        print("|---|---|---|---|---|")
        for variant in ("float32", "int8"):
            runners = {k: runner(b, variant) for k, b in bundles.items()}
            for name, beam in (("greedy", 1), ("beam 4", 4)):
                tokens = {k: decode_tokens(r, sources, beam) for k, r in runners.items()}
                same = sum(a == b for a, b in zip(tokens["float32"], tokens["float16"], strict=True))
                got = {
                    k: scores([bundles[k].tokenizer.decode(t) for t in ts], refs, bundles[k].target_lang)
                    for k, ts in tokens.items()
                }
                chrf, bleu = (" / ".join(f"{got[k][m]:.2f}" for k in ("float32", "float16")) for m in ("chrF", "BLEU"))
                print(f"| {variant} | {name} | {same}/{len(test)} | {chrf} | {bleu} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2, help="random models: encoder and decoder layers of each")
    parser.add_argument("--rounds", type=int, default=3, help="random models: start-ups timed per bundle (median)")
    parser.add_argument("--bundle", type=Path, default=None, help="a trained bundle stored as float32")
    parser.add_argument("--corpus", type=Path, default=CORPUS.parent, help="with --bundle: its corpus directory")
    parser.add_argument("--limit", type=int, default=None, help="with --bundle: the first N test pairs only")
    args = parser.parse_args()
    if args.bundle is None:
        random_models(args.layers, args.rounds)
    else:
        trained_bundle(args.bundle, args.corpus, args.limit)


if __name__ == "__main__":
    main()
