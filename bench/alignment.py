"""Word alignments (service/serving/alignment.py) against two self-supervised golds from the held-out corpus, per
shipped pair: the rule is chosen on dev and reported on test beside the last layer's argmax.

1. Copied words: a source word with a letter and a capital or a digit (product names, acronyms) that occurs once
   among the source's words and once among the reference's must align to its copy, the reference force-decoded.
2. Protected spans: a span of a text whose spans the ``decoded`` path restored (the model copied each stand-in),
   whose text occurs once in the text and once in the translation, must align to where the model put it.

A gold item is a set of source words and a set of target words. Recall: the items with a link between the two;
precision: of the links that touch an item's words, those between its two sets.

    python bench/alignment.py [--n 300]
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from dataclasses import replace
from pathlib import Path

from common import machine, write_section

from service.errors import ServiceError
from service.serving.alignment import BASELINE, DEFAULT, METHODS, Alignable, Rule, SegmentInput, alignable
from service.serving.engine import Engine
from service.serving.translation import Filters, Options
from service.settings import Settings
from service.text.spans import find_spans, has_spans
from service.text.words import words

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path.home() / ".cache" / "attnserve" / "corpus"
PAIRS = ("en-ja", "en-de")
Item = tuple[set[int], set[int]]
Case = tuple[Alignable, list[Item]]


def rows(pair: str, split: str) -> list[tuple[str, str]]:
    lines = (CORPUS / pair / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
    out = [(f[0], f[1]) for f in (ln.split("\t") for ln in lines) if len(f) >= 2]
    random.Random(0).shuffle(out)
    return out


def name_like(word: str) -> bool:
    return len(word) >= 2 and any(c.isalpha() for c in word) and any(c.isupper() or c.isdigit() for c in word)


def copied_items(source: str, target: str, langs: tuple[str, str]) -> list[Item]:
    """Gold 1 over the words of ``source`` and ``target``."""
    sw = [source[a:b] for a, b in words(source, langs[0])]
    tw = [target[a:b] for a, b in words(target, langs[1])]
    return [({sw.index(w)}, {tw.index(w)}) for w in set(sw) if name_like(w) and sw.count(w) == 1 and tw.count(w) == 1]


def covering(spans: list[tuple[int, int]], start: int, end: int) -> set[int]:
    return {k for k, (a, b) in enumerate(spans) if a < end and start < b}


def copied_cases(engine: Engine, data: list[tuple[str, str]], n: int) -> list[Case]:
    """Gold 1: each reference force-decoded (/attention's path), its cross-attention made an Alignable."""
    out: list[Case] = []
    for source, target in data:
        items = copied_items(source, target, engine.pair)
        if not items:
            continue
        try:
            (result,) = engine.attention_now([source], Options(), Filters(kinds=["cross"]), [target])
        except ServiceError:  # a reference laid out otherwise than its source
            continue
        segments = [
            SegmentInput(s.source, s.target, s.model_input, s.target_tokens, s.weights["cross"].transpose(2, 0, 1, 3))
            for s in result.segments
        ]
        spec = engine.bundle.spec
        a = alignable(engine.tokenizer, engine.pair, source, result.text, segments, (spec.n_decoder_layers, spec.h))
        out.append((a, items))
        if len(out) == n:
            break
    return out


def span_cases(engine: Engine, data: list[tuple[str, str]], n: int) -> list[Case]:
    """Gold 2: texts with spans translated as /translate does, those the ``decoded`` path restored."""
    texts = [s for s, _ in data if "\n" not in s and has_spans(s, engine.text.vocabulary)][: 3 * n]
    out: list[Case] = []
    for start in range(0, len(texts), 16):
        batch = texts[start : start + 16]
        for text, t in zip(batch, engine.translate_now(batch, Options(details=True, alignments=True)), strict=True):
            if t.details is None or t.details.spans != "decoded" or t.alignable is None:
                continue
            items = []
            for span in find_spans(text, engine.text.vocabulary):
                piece = text[span.start : span.end]
                if text.count(piece) == 1 and t.text.count(piece) == 1:
                    at = t.text.index(piece)
                    a = t.alignable
                    items.append(
                        (covering(a.source_words, span.start, span.end), covering(a.target_words, at, at + len(piece)))
                    )
            if items:
                out.append((t.alignable, items))
        if len(out) >= n:
            break
    return out[:n]


def score(cases: list[Case], rule: Rule) -> tuple[float, float]:
    """(precision, recall) of ``rule``'s links on ``cases``."""
    found = total = right = touching = 0
    for a, items in cases:
        index_s = {s: k for k, s in enumerate(a.source_words)}
        index_t = {s: k for k, s in enumerate(a.target_words)}
        links = [(index_s[s], index_t[t]) for s, t in a.links(rule)]
        for sources, targets in items:
            total += 1
            found += any(s in sources and t in targets for s, t in links)
        for s, t in links:
            hit = [i for i in items if s in i[0] or t in i[1]]
            touching += bool(hit)
            right += any(s in i[0] and t in i[1] for i in hit)
    return (right / touching if touching else 0.0, found / total if total else 0.0)


def f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


def candidates(layers: int, heads: int) -> list[Rule]:
    """Every layer, step and method with the heads averaged, and the last layer's heads one at a time."""
    averaged = [
        Rule(layer, None, shift, m) for layer, shift, m in itertools.product(range(layers), (False, True), METHODS)
    ]
    return averaged + [Rule(layers - 1, (h,), False, "agreed") for h in range(heads)]


METHOD_NAMES = {"pieces": "piece argmax", "words": "word argmax", "agreed": "words agreed both ways"}


def describe(rule: Rule, layers: int) -> str:
    heads = "all heads" if rule.heads is None else f"heads {list(rule.heads)}"
    layer = rule.layer % layers
    return (
        f"layer {layer}, {heads}, {'step that read it' if rule.shift else 'step that produced it'}, "
        f"{METHOD_NAMES[rule.method]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="texts per gold, pair and split")
    args = parser.parse_args()
    started = time.monotonic()
    cases: dict[tuple[str, str, str], list[Case]] = {}
    layers, heads = {}, {}
    for pair in PAIRS:
        engine = Engine.load(ROOT / "model" / "bundles" / pair, Settings())
        layers[pair], heads[pair] = engine.bundle.spec.n_decoder_layers, engine.bundle.spec.h
        for split in ("dev", "test"):
            data = rows(pair, split)
            cases[pair, split, "copied"] = copied_cases(engine, data, args.n)
            cases[pair, split, "spans"] = span_cases(engine, data, args.n)
            print(pair, split, {g: len(cases[pair, split, g]) for g in ("copied", "spans")}, flush=True)
    L = min(layers.values())
    dev = {}
    for rule in candidates(L, min(heads.values())):
        scores = [f1(*score(cases[p, "dev", g], rule)) for p in PAIRS for g in ("copied", "spans")]
        dev[rule] = sum(scores) / len(scores)
        print(describe(rule, L), f"{dev[rule]:.3f}", flush=True)
    best = max(dev, key=lambda r: dev[r])
    write(cases, dev, best, L, args.n, time.monotonic() - started)


def write(cases: dict, dev: dict, best: Rule, L: int, n: int, seconds: float) -> None:  # long: the section's text
    lines = [
        "## Word alignments (bench/alignment.py)",
        "",
        f"`python bench/alignment.py --n {n}` ({seconds / 60:.0f} min; {machine()}; shared with other work, which "
        "changes no number here). The shipped bundles, greedy. Gold 1, *copied*: source words with a capital or a "
        "digit that occur once in the source and once in the reference (product names, acronyms), the reference "
        "force-decoded. Gold 2, *spans*: protected spans of texts that the `decoded` path restored, whose text "
        "occurs once in the source and once in the translation. Recall: gold items linked; precision: of the links "
        "that touch a gold item's words, those that link it right. The rule is chosen on dev (mean F1 over both "
        "golds and both pairs); the table is test.",
        "",
        "Dev, mean F1 per rule:",
        "",
        "| rule | mean F1 |",
        "|---|---:|",
        *(f"| {describe(r, L)}{' (chosen)' if r == best else ''} | {v:.3f} |" for r, v in sorted(
            dev.items(), key=lambda kv: -kv[1])),
        "",
        f"Test: the chosen rule ({describe(best, L)}) against the last layer's argmax ({describe(BASELINE, L)}):",
        "",
        "| pair | gold | items | baseline P | baseline R | baseline F1 | rule P | rule R | rule F1 | ΔF1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for (pair, split, gold), data in cases.items():
        if split != "test":
            continue
        (bp, br), (rp, rr) = score(data, BASELINE), score(data, best)
        items = sum(len(i) for _, i in data)
        lines.append(
            f"| {pair} | {gold} | {items} ({len(data)} texts) | {bp:.3f} | {br:.3f} | {f1(bp, br):.3f} | {rp:.3f} | "
            f"{rr:.3f} | {f1(rp, rr):.3f} | {f1(rp, rr) - f1(bp, br):+.3f} |"
        )
    default = replace(DEFAULT, layer=DEFAULT.layer % L)
    shipped = "is" if best == default else f"is not (it is {describe(default, L)})"
    lines += ["", f"The chosen rule {shipped} service/serving/alignment.py's `DEFAULT`."]
    write_section("alignment", "\n".join(lines))


if __name__ == "__main__":
    main()
