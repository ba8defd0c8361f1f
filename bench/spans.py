"""Protected spans on the held-out split: how masking and cross-attention placement keep and place them, what they
cost, and the cost of the text pipeline on plain texts. Writes docs/BENCHMARKS.md's ``spans`` section.

    python bench/spans.py [--bundle model/bundles/en-ja] [--n-speed 1000]

The layer/head aggregation is chosen on dev.tsv (placement accuracy) and every figure is reported on test.tsv.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import sacrebleu
from common import CORPUS, machine, versions, write_section
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from service.decoding import DecodeRequest, decode
from service.serving.engine import Engine
from service.serving.translation import Options
from service.settings import EN_JA, Settings
from service.text.detect import Detector
from service.text.placement import Aggregation, copied, positions, restore
from service.text.spans import FORMAT_KINDS, Masked, find_spans, mask

TOLERANCE = 0.2  # placement: the span's relative position within this of the reference's


def rows(path: Path, engine: Engine) -> list[tuple[str, str, Masked, list[str]]]:
    """(source, reference, masked source, each span group's kinds joined) of the split's lines with spans."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        source, reference = line.split("\t")[:2]
        spans = find_spans(source, engine.text.vocabulary)
        if spans:
            out.append((source, reference, mask(source, spans), [s.kind for s in spans]))
    return out


def relative(text: str, span: str, start: int) -> tuple[float, int] | None:
    """Where ``span`` is in ``text`` (first occurrence from ``start``), as a fraction of the text's other
    characters, and where to look for the next one."""
    i = text.find(span, start)
    if i < 0:
        return None
    return i / max(1, len(text) - len(span)), i + len(span)


def placed(hyp: str, ref: str, outputs: list[str]) -> tuple[int, int]:
    """(groups found in both, groups whose relative positions agree within TOLERANCE)."""
    both = good = 0
    h = r = 0
    for o in outputs:
        a, b = relative(hyp, o, h), relative(ref, o, r)
        if a is None or b is None:
            continue
        both += 1
        good += abs(a[0] - b[0]) <= TOLERANCE
        h, r = a[1], b[1]
    return both, good


def kept(text: str, spans: list[str]) -> Counter[str]:
    """Per span text, how many of its occurrences ``text`` lacks."""
    need, have = Counter(spans), Counter[str]()
    for s in need:
        have[s] = text.count(s)
    return Counter({s: max(0, n - have[s]) for s, n in need.items()})


def decode_all(engine: Engine, texts: list[str], attention: bool, desc: str) -> list:
    runner = engine.runners.exact if attention else engine.runners.fast
    out = []
    for i in tqdm(range(0, len(texts), 32), desc=desc, leave=False):
        requests = [engine._request(t, Options(), attention) for t in texts[i : i + 32]]
        out += [(r, res) for r, res in zip(requests, decode(runner, requests), strict=True)]
    return out


def restored(engine: Engine, masked: Masked, request: DecodeRequest, result, how: Aggregation | str) -> str:
    tok = engine.tokenizer
    hyp = result.hypotheses[0]
    tokens = [t for t in hyp.tokens if t not in tok.special]
    pieces = tok.pieces(tokens)
    cross = np.stack(hyp.cross_attention)
    if how == "copy":  # the model's own copies, attention for the rest
        fallback = positions(masked, tok.pieces(request.src), Aggregation().apply(cross), len(tokens))
        places = [c if c is not None else f for c, f in zip(copied(masked, pieces), fallback, strict=True)]
    else:
        assert isinstance(how, Aggregation)
        places = positions(masked, tok.pieces(request.src), how.apply(cross), len(tokens))
    return restore(masked, pieces, places, lambda p: str(tok.target.decode_pieces(p)))


def kind_class(kind: str) -> str:
    return "format" if kind in FORMAT_KINDS else "tags/entities" if kind in ("tag", "entity") else "other"


def scores(data, hyps: list[str]) -> dict[str, float]:
    """Keeping per kind class, placement accuracy, chrF."""
    missing: Counter[str] = Counter()
    total: Counter[str] = Counter()
    both = good = 0
    for (source, reference, masked, _), hyp in zip(data, hyps, strict=True):
        spans = find_spans(source)
        for span in spans:
            total[kind_class(span.kind)] += 1
        lacks = kept(hyp, [s.output for s in spans])
        for span in spans:
            if lacks[span.output] > 0:
                missing[kind_class(span.kind)] += 1
                lacks[span.output] -= 1
        b, g = placed(hyp, reference, masked.outputs)
        both, good = both + b, good + g
    out = {f"kept {c}": 100 * (1 - missing[c] / total[c]) for c in total}
    out["placement"] = 100 * good / max(1, both)
    out["chrF"] = float(sacrebleu.corpus_chrf(hyps, [[r[1] for r in data]]).score)
    return out


def aggregations(h: int) -> list[Aggregation]:
    return [Aggregation(layers, head) for layers in ("last", "mean") for head in (None, *range(h))]


def speed(engine: Engine, texts: list[str], before: Callable[[list[str]], None] | None = None) -> float:
    """Texts per second through Engine.translate_now, in batches of 32, each batch first through ``before``."""
    t = time.perf_counter()
    for i in range(0, len(texts), 32):
        if before is not None:
            before(texts[i : i + 32])
        engine.translate_now(texts[i : i + 32], Options())
    return len(texts) / (time.perf_counter() - t)


def preparation(engine: Engine, plain: list[str], with_spans: list[str]) -> tuple[float, float, float, float]:
    """Microseconds a text of the pipeline's own work, without decoding (best of five): the fast path's checks on
    plain texts, layout and sentence splitting of every line, detecting each text's language, and finding and
    masking spans."""
    pipeline = engine.text
    detector = Detector()

    def per_text(texts: list[str], work: Callable[[list[str]], object] = pipeline.prepare) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for i in range(0, len(texts), 32):
                work(texts[i : i + 32])
            best = min(best, (time.perf_counter() - t) / len(texts) * 1e6)
        return best

    checks = per_text(plain)
    split, pipeline.split_chars = pipeline.split_chars, 1
    splitting = per_text(plain)
    pipeline.split_chars = split
    detecting = per_text(plain, lambda texts: [detector.best(t) for t in texts])
    return checks, splitting, detecting, per_text(with_spans)


def interleaved(engine: Engine, plain: list[str], with_spans: list[str], rounds: int = 5) -> tuple[float, ...]:
    """Best of ``rounds`` for each configuration, the configurations taking turns so that a noisy neighbour
    slows them alike (a first round warms them and is not counted): plain texts without the pipeline, with its
    checks, through layout and sentences for every line, with ``source: "auto"``'s detection; texts with spans
    unmasked, and masked."""
    prepare, split = engine.text.prepare, engine.text.split_chars
    detector = Detector()

    def bare(*_: object, **__: object) -> None:
        return None

    def detected(texts: list[str]) -> None:
        for text in texts:  # what detect_sources does a text; short strings may detect as another language
            detector.best(text)

    configs: list[tuple[list[str], Callable[..., object], int, Callable[[list[str]], None] | None]]
    configs = [(plain, bare, split, None), (plain, prepare, split, None), (plain, prepare, 1, None)]
    configs += [(plain, prepare, split, detected), (with_spans, bare, split, None), (with_spans, prepare, split, None)]
    best = [0.0] * len(configs)
    for r in tqdm(range(rounds + 1), desc="speed", leave=False):
        for k, (texts, how, chars, before) in enumerate(configs):
            engine.text.prepare, engine.text.split_chars = how, chars  # type: ignore[method-assign,assignment]
            rate = speed(engine, texts, before)
            best[k] = max(best[k], rate) if r else 0.0
    engine.text.prepare, engine.text.split_chars = prepare, split  # type: ignore[method-assign]
    return tuple(best)


def again_share(engine: Engine, texts: list[str]) -> float:
    """The share of the texts' segments with spans whose cross-attention the service asks the forced decoder for."""
    prepared = engine.text.prepare(texts)
    assert prepared is not None
    segments = prepared.segments
    requests = engine._segment_requests(prepared, Options())
    results = decode(engine.runners.fast, requests)
    needs = engine.text.needs_attention
    again = [s for s, r in zip(segments, results, strict=True) if any(needs(s, h) for h in r.hypotheses)]
    return len(again) / max(1, sum(s.masked is not None for s in segments))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", type=Path, default=EN_JA)
    parser.add_argument("--n-speed", type=int, default=1000)
    args = parser.parse_args()
    engine = Engine.load(args.bundle, Settings(threads=1))
    engine.warm_up()
    dev, test = rows(CORPUS.with_name("dev.tsv"), engine), rows(CORPUS, engine)
    h = engine.bundle.spec.h

    # Choose the aggregation on dev.
    decoded = decode_all(engine, [m.text for _, _, m, _ in dev], True, "dev")
    choice = {}
    for how in tqdm([*aggregations(h), "copy"], desc="aggregations", leave=False):
        hyps = [restored(engine, d[2], r, res, how) for d, (r, res) in zip(dev, decoded, strict=True)]
        choice[how] = scores(dev, hyps)["placement"]
    best = max(choice, key=lambda k: choice[k])

    # Report on test: no masking (the model alone), masking with the default and the chosen placement.
    raw = [
        engine.tokenizer.decode(res.hypotheses[0].tokens)
        for _, res in decode_all(engine, [d[0] for d in test], False, "test raw")
    ]
    decoded = decode_all(engine, [m.text for _, _, m, _ in test], True, "test masked")
    table = {"no masking (the model alone)": scores(test, raw)}
    for how in dict.fromkeys([Aggregation(), "copy", best]):
        hyps = [restored(engine, d[2], r, res, how) for d, (r, res) in zip(test, decoded, strict=True)]
        table[f"stand-ins, placed by {name(how)}"] = scores(test, hyps)
    service = [
        t.text
        for i in range(0, len(test), 32)
        for t in engine.translate_now([d[0] for d in test[i : i + 32]], Options())
    ]
    table["the service (`Engine.translate_now`: the model's copies, cross-attention where it copied none)"] = scores(
        test, service
    )
    table["human translations"] = scores(test, [d[1] for d in test])

    plain = [
        t for t in (ln.split("\t")[0] for ln in CORPUS.read_text(encoding="utf-8").splitlines()) if engine.text.plain(t)
    ]
    plain = plain[: args.n_speed]
    with_spans = [d[0] for d in test][: args.n_speed]
    speeds = interleaved(engine, plain, with_spans)
    costs = preparation(engine, plain, with_spans)
    write(dev, test, choice, best, table, speeds, costs, len(plain), again_share(engine, with_spans))


def name(how: Aggregation | str) -> str:
    if how == "copy":
        return "the model's copies (attention where it copied none)"
    assert isinstance(how, Aggregation)
    head = "heads averaged" if how.head is None else f"head {how.head}"
    return f"cross-attention, {how.layers} layer{'s' if how.layers == 'mean' else ''}, {head}"


def pct(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.1f} %"


# long: the section's text, one part after another
def write(dev, test, choice, best, table, speeds, costs, n_plain, again) -> None:
    base, checked, split, detected, spans_base, spans_speed = speeds
    cols = ["kept format", "kept tags/entities", "kept other", "placement", "chrF"]
    lines = [
        "## Protected spans",
        "",
        f"`python bench/spans.py` on {machine()}; {versions('onnxruntime', 'sentencex')}. The test split's lines "
        f"that carry a span ({len(test)} of them; dev: {len(dev)}), greedy decoding of model/bundles/en-ja. Load "
        f"average when written: {os.getloadavg()[0]:.1f} (1 min), {os.getloadavg()[1]:.1f} (5 min).",
        "",
        "- *kept*: of the spans in the sources (format = printf, brace and Weblate markers; tags/entities; other = "
        "URLs, e-mail addresses, characters the vocabulary lacks), the share the output has (each occurrence counted).",
        f"- *placement*: of the span groups found in both the output and the human translation, the share whose "
        f"position, as a fraction of the text's other characters, is within {TOLERANCE} of the reference's.",
        "- *chrF*: of these lines against the human translations.",
        "",
        "| | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for label, s in table.items():
        lines.append(f"| {label} | " + " | ".join(f"{s[c]:.1f}" if c in s else "–" for c in cols) + " |")
    ranked = sorted(choice.items(), key=lambda kv: -kv[1])
    lines += [
        "",
        f"Aggregation chosen on dev (placement accuracy): **{name(best)}** ({choice[best]:.1f} %). The others on dev: "
        + "; ".join(f"{name(k)} {v:.1f}" for k, v in ranked[1:6])
        + f"; last layer, heads averaged {choice[Aggregation()]:.1f}.",
        "",
        "Cost, texts per second through `Engine.translate_now` (batches of 32, one thread, best of five rounds "
        f"taken in turn; {n_plain} plain test texts):",
        "",
        "| step | texts/s | vs plain /translate |",
        "|---|---:|---:|",
        f"| plain texts, without the pipeline | {base:.0f} | – |",
        f"| plain texts, with the pipeline's checks (the fast path) | {checked:.0f} | {pct(checked, base)} |",
        f"| plain texts, every line through layout and sentence splitting | {split:.0f} | {pct(split, base)} |",
        f'| plain texts, `source: "auto"` (each text\'s language detected first) | {detected:.0f} | '
        f"{pct(detected, base)} |",
        f"| texts with spans, unmasked | {spans_base:.0f} | – |",
        f"| texts with spans, masked and placed (fast graphs; the {100 * again:.1f} % whose stand-ins the model "
        f"did not all copy get their cross-attention from one forced-decoder call on the exact graphs) | "
        f"{spans_speed:.0f} | "
        f"{pct(spans_speed, spans_base)} |",
    ]
    checks, splitting, detecting, masking = costs
    lines += [
        "",
        "These throughputs move by more than 10 % from run to run on this shared machine (the texts decode the "
        "same), so the pipeline's own work is also timed alone, per text, without decoding (best of five), against "
        f"a plain text's decoding time at the rate above ({1e6 / base:.0f} µs):",
        "",
        "| the pipeline's work | µs a text | share of a plain text's decoding |",
        "|---|---:|---:|",
        f"| fast-path checks (every /translate text) | {checks:.1f} | {100 * checks * base / 1e6:.2f} % |",
        f"| layout and sentence splitting of every line | {splitting:.1f} | {100 * splitting * base / 1e6:.2f} % |",
        f'| detecting the language (`source: "auto"`) | {detecting:.1f} | {100 * detecting * base / 1e6:.2f} % |',
        f"| finding and masking spans (texts with spans) | {masking:.1f} | {100 * masking * base / 1e6:.2f} % |",
    ]
    write_section("spans", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
