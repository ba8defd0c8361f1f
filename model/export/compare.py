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
from model.evaluate import decode_tokens, scores
from service.runtime.bundle import load_bundle
from service.runtime.runner import DecoderRole, open_runner


def compare(before: Path, after: Path, corpus: Path, variants: list[str], limit: int | None) -> dict[str, Any]:
    """Per variant and decoding: the texts whose tokens differ, and chrF before and after."""
    test = read_pairs(corpus / "test.tsv")[:limit]
    sources, refs = [s for s, _ in test], [t for _, t in test]
    bundles = [load_bundle(before), load_bundle(after)]
    report: dict[str, Any] = {"texts": len(sources)}
    for variant in variants:
        role: DecoderRole = "fast_decoder" if variant == "float32" else "decoder"
        runners = [open_runner(b, "cpu", 0, variant, role) for b in bundles]
        for name, beam in (("greedy", 1), ("beam 4", 4)):
            ids = [decode_tokens(r, sources, beam) for r in runners]
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
