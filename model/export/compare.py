"""Two bundles' tokens side by side on a corpus split: how many texts decode to other tokens (greedy and beam 4,
on the graphs /translate uses: the fast decoder for float32, the int8 graphs for int8), and each one's chrF.

    python -m model.export.compare model/bundles/en-ja /tmp/other --corpus ~/.cache/attnserve/corpus/en-ja
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from model.data import read_pairs
from model.evaluate import scores
from service.bundle import load_bundle
from service.decoding import DecodeRequest, decode
from service.runner import Runner


def tokens(runner: Runner, texts: list[str], beam_size: int, batch_size: int = 48) -> list[list[int]]:
    """Each text's best hypothesis' tokens, decoded as model/evaluate.py's ``translate`` decodes them."""
    tok = runner.bundle.tokenizer
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[list[int]] = [[] for _ in texts]
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        requests = []
        for i in idx:
            src = tok.encode_source(texts[i])[: runner.spec.max_positions]
            requests.append(DecodeRequest(src=src, beam_size=beam_size, max_length=min(2 * len(src) + 10, 256)))
        for i, result in zip(idx, decode(runner, requests), strict=True):
            out[i] = list(result.hypotheses[0].tokens)
    return out


def compare(before: Path, after: Path, corpus: Path, variants: list[str], limit: int | None) -> dict[str, Any]:
    """Per variant and decoding: the texts whose tokens differ, and chrF before and after."""
    test = read_pairs(corpus / "test.tsv")[:limit]
    sources, refs = [s for s, _ in test], [t for _, t in test]
    bundles = [load_bundle(before), load_bundle(after)]
    report: dict[str, Any] = {"texts": len(sources)}
    for variant in variants:
        runners = [Runner(b, "cpu", threads=0, fast=variant == "float32", variant=variant) for b in bundles]
        for name, beam in (("greedy", 1), ("beam 4", 4)):
            ids = [tokens(r, sources, beam) for r in runners]
            texts = [[b.tokenizer.decode(t) for t in side] for b, side in zip(bundles, ids, strict=True)]
            report[f"{name}, {variant}"] = {
                "differ": sum(a != b for a, b in zip(*ids, strict=True)),
                "chrF before": scores(texts[0], refs)["chrF"],
                "chrF after": scores(texts[1], refs)["chrF"],
            }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--variant", action="append", help="float32 (default) and/or int8")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    report = compare(args.before, args.after, args.corpus, args.variant or ["float32"], args.limit)
    print(json.dumps(report, indent=2))  # noqa: T201 (command-line output)


if __name__ == "__main__":
    main()
