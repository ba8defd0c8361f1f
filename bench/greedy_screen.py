"""Greedy float32 on the fast decoder (``attnserve.GreedyTokens``: an int8 screen of the vocabulary, float32 logits for
the tokens it cannot rule out, every token's when too many pass) against the exact runner (float32 logits from one
MatMul, argmax on the host), on flat and on trained logits, side by side in one process: each round runs every
runner once on the same batches, in turn, and the best round counts. Time is the decoding thread's CPU time (one
intra-op thread: ONNX Runtime runs on the calling thread), so other work on a shared machine does not count.

- **flat**: the OPUS-MT transformer-base shape (d 512, 6+6 layers, 8 heads, FFN 2048, 58,000 pieces, Marian's swish
  and final logits bias) with random weights drawn as a new MarianMTModel's are (every matrix and embedding from
  N(0, 0.02), biases 0), built here and cached; its logits are flat, so its outputs run to ``--max-length``. Sources
  are random piece ids.
- **unsure**: the same shape, untied, its output projection's rows one shared direction plus a small spread: every
  logit of a step lies within the screen's error bound of the largest, so nearly every piece passes the screen (a
  model unsure of the next token: the screen's worst case, where rows fall back to every token's float32 logit).
- **trained**: model/bundles/en-ja on the test split's sources (or a few built-in sentences).

``--before LIB`` adds the fast decoder with another build of service/runtime/_attention.c (e.g. the previous commit's
``.so``), for a before/after of the kernel in the same run. Every runner's tokens must be the exact runner's.

    python bench/greedy_screen.py
    python bench/greedy_screen.py --models flat unsure --before /tmp/_attention.before.so
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import numpy as np
from common import CORPUS, ROOT, machine, texts

sys.path.insert(0, str(ROOT))

from service.decoding import DecodeRequest, decode
from service.runtime.bundle import FORMAT, Bundle, load_bundle
from service.runtime.manifest import Manifest, is_bundle
from service.runtime.runner import Runner, open_runner

CACHE = Path.home() / ".cache" / "attnserve" / "bench"
FLAT_VOCAB = 58_000
SPREAD = 0.1  # the unsure model's output rows: the shared direction's scale times this, drawn per row


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["flat", "trained"], choices=["flat", "unsure", "trained"])
    ap.add_argument("--trained", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=int, default=64, help="sources decoded, --batch at a time")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, default=None, help="another build of the kernels' library, also timed")
    return ap.parse_args(argv)


def flat_bundle(name: str = "flat", cache: Path = CACHE) -> Path:
    """The transformer-base shape with random weights (``name`` flat or unsure), exported once (torch) into the
    cache (again for another bundle format)."""
    path = cache / f"{name}-base-58k"
    if is_bundle(path) and Manifest.read(path).format == FORMAT:
        return path
    import torch

    from model.export.bundle import export_bundle
    from model.transformer import TransformerConfig, make_model

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=FLAT_VOCAB, pad_id=FLAT_VOCAB - 1, decoder_start_id=FLAT_VOCAB - 1,
                               activation="swish", final_logits_bias=True,
                               tie_embeddings=name != "unsure")  # fmt: skip
    model = make_model(config)
    with torch.no_grad():  # transformers' MarianPreTrainedModel._init_weights (init_std 0.02)
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
            elif "norm" not in name:
                p.zero_()
        model.src_embed.lut.weight[config.pad_id].zero_()
        if name == "unsure":
            proj = model.generator.proj.weight
            proj.copy_(torch.randn(config.d_model) * 0.02 + torch.randn_like(proj) * 0.02 * SPREAD)
    spm = ROOT / "model" / "bundles" / "en-ja" / "spm.model"  # any tokenizer: the sources are ids
    tokenizer = {"source": spm, "target": spm}
    return export_bundle(model.eval(), path, name=name, source_lang="en", target_lang="ja",
                         tokenizer=tokenizer, force=True)  # fmt: skip


def sources(bundle: Bundle, name: str, n: int) -> list[list[int]]:
    """Random ids for the flat model (8 to 30 a source, </s> last), the test split's sources for the trained one."""
    if name != "trained":
        rng = np.random.default_rng(0)
        eos, V = bundle.spec.eos_id, bundle.spec.vocab_size
        return [[*rng.integers(2, V - 1, rng.integers(8, 31)).tolist(), eos] for _ in range(n)]
    return [bundle.tokenizer.encode_source(t) for t in texts(CORPUS, n)]


def timed(runner: Runner, srcs: list[list[int]], batch: int, max_length: int) -> tuple[float, list[list[int]]]:
    """CPU seconds of this thread to decode ``srcs`` greedily, ``batch`` at a time, and the tokens."""
    tokens = []
    start = time.thread_time()
    for i in range(0, len(srcs), batch):
        requests = [DecodeRequest(src=s, beam_size=1, max_length=max_length) for s in srcs[i : i + batch]]
        tokens += [r.hypotheses[0].tokens for r in decode(runner, requests)]
    return time.thread_time() - start, tokens


def runners(bundle: Bundle, before: Path | None) -> dict[str, Callable[[], Runner]]:
    """The runners compared, each made when its turn comes (``before``: the fast decoder on another library)."""

    def fast_before() -> Runner:
        with mock.patch("service.runtime.runner.attention_library", lambda: str(before)):
            return open_runner(bundle, "cpu", role="fast_decoder")

    made = {
        "exact": lambda: open_runner(bundle, "cpu"),
        "fast": lambda: open_runner(bundle, "cpu", role="fast_decoder"),
    }
    return made | ({"fast, before": fast_before} if before else {})


def compare(name: str, bundle: Bundle, args: argparse.Namespace) -> list[str]:
    srcs = sources(bundle, name, args.texts)
    made = {label: make() for label, make in runners(bundle, args.before).items()}
    best: dict[str, float] = {}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.rounds):
        for label, runner in made.items():
            seconds, outputs[label] = timed(runner, srcs, args.batch, args.max_length)
            best[label] = min(best.get(label, seconds), seconds)
    generated = sum(len(t) for t in outputs["exact"])
    rows = []
    for label in made:
        same = sum(a == b for a, b in zip(outputs[label], outputs["exact"], strict=True))
        rate = generated / best[label]
        ratio = best["exact"] / best[label]
        rows.append(f"| {name} | {label} | {rate:,.0f} | {ratio:.2f}× | {same}/{len(srcs)} |")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    lines = [
        f"{machine()}; one thread; {args.texts} sources, {args.batch} a batch, greedy, max_length {args.max_length}; "
        f"best of {args.rounds} rounds",
        "",
        "| logits | runner | target tokens/s | vs exact | tokens = exact's |",
        "|---|---|---|---|---|",
    ]
    for name in args.models:
        bundle = load_bundle(args.trained if name == "trained" else flat_bundle(name))
        lines += compare(name, bundle, args)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
