"""Whole outputs: the service's translations of the test split's lines with a span or a number, and of lines written
like the held-out multi-tag line, checked for broken stand-ins, kept spans, placement, numbers and repetition
loops. Writes docs/BENCHMARKS.md's ``spans-whole`` section from two runs: the code before (``--save``, run in a
checkout of that code) and after (``--before`` the saved file).

    python bench/spans_whole.py --save /tmp/before.json            # in a checkout of the code before
    python bench/spans_whole.py --before /tmp/before.json          # here: measures, compares, writes the section

With ``--split``, the whole test split of each shipped pair instead, with default options (the ``spans-guards``
section: loops, digits and chrF, on the split and on the 1,000 held-out texts that bench/common.py's ``pairs``
samples):

    python bench/spans_whole.py --split --save /tmp/split-before.json   # in a checkout of the code before
    python bench/spans_whole.py --split --before /tmp/split-before.json # here (or in two steps: --save --trials
                                                                        # then --after the saved file)

Self-contained on purpose: it imports only what every version of the service has (``Engine.translate_now``, the
span patterns), so that it measures any checkout alike.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import unicodedata
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import sacrebleu
from common import CORPUS, machine, versions, write_section

sys.path.insert(0, str(Path.cwd()))  # the checkout being measured (run from its root)
from service.serving.engine import Engine
from service.serving.translation import Options
from service.settings import EN_JA, MODEL_BUNDLES, Settings
from service.text.spans import SPANS, find_spans, mask

NUMBER = re.compile(r"(?<![A-Za-z0-9_])\d+(?:[.,]\d+)*(?![A-Za-z0-9_])")
TAG = re.compile(r"</?[A-Za-z][^<>]*>")
LOOP = re.compile(r"(.{2,20}?)\1{2,}")
RUN = re.compile(r"([^\W\d_])\1{3,}")  # one letter or ideograph four times or more in a row
DIGITS = re.compile(r"\d+")
SPLIT_PAIRS = ("en-ja", "en-de")
HELD_OUT = 1000
# Repetition guards tried on the outputs that loop (service/serving/unlooping.py's Guard fields), and penalties
# tried on every text as a CTranslate2 or transformers user sets them.
GUARDS: dict[str, dict[str, Any]] = {
    "beam 4": {"beam_size": 4},
    "repetition_penalty 1.2": {"repetition_penalty": 1.2},
    "repetition_penalty 1.2, beam 4": {"repetition_penalty": 1.2, "beam_size": 4},
    "no_repeat_ngram_size 3": {"no_repeat_ngram_size": 3},
    "no_repeat_ngram_size 4": {"no_repeat_ngram_size": 4},
    "no_repeat_ngram_size 3, beam 4": {"no_repeat_ngram_size": 3, "beam_size": 4},
}
EVERYWHERE: dict[str, dict[str, Any]] = {
    "repetition_penalty 1.2": {"repetition_penalty": 1.2},
    "no_repeat_ngram_size 3": {"no_repeat_ngram_size": 3},
}
TOLERANCE = 0.2
# Lines on the pattern of the held-out multi-tag line: several inline tags and a format directive.
WRITTEN = [
    "<b>zoom</b>: scroll, <b>pan</b>: shift+drag, <b>rotate</b>: ctrl+drag, <b>reset</b>: double-click (%d%%)",
    "<b>Open</b>: ctrl+O, <b>Save</b>: ctrl+S, <b>Quit</b>: ctrl+Q",
    "Press <kbd>Ctrl</kbd>+<kbd>C</kbd> to copy and <kbd>Ctrl</kbd>+<kbd>V</kbd> to paste",
    "<i>%s</i> of <i>%s</i> files copied (%d%%)",
    "<b>Warning:</b> %d files will be <b>deleted</b> permanently",
    '<a href="%s">Download</a> or <a href="%s">view</a> the log',
    "<b>left</b>: select, <b>middle</b>: paste, <b>right</b>: menu",
    "Uploaded {count} of {total} files to <b>{folder}</b>",
    "<b>Name:</b> %1$s<br/><b>Size:</b> %2$s<br/><b>Date:</b> %3$s",
    '<span class="key">Tab</span>: next field, <span class="key">Shift+Tab</span>: previous field',
    "Receives 60% defense on sand and 30% in water",
    "Battery at %d%%, <b>%d minutes</b> left",
]


def lines() -> list[tuple[str, str | None]]:
    """The test split's lines with a pattern span or a number (with references), then the written ones."""
    out: list[tuple[str, str | None]] = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        source, reference = line.split("\t")[:2]
        if SPANS.search(source) or NUMBER.search(source):
            out.append((source, reference))
    return out + [(w, None) for w in WRITTEN]


def nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def spans_of(source: str) -> list[str]:
    """The source's pattern spans' texts, numbers aside."""
    return [m.group() for m in SPANS.finditer(source) if not NUMBER.fullmatch(m.group())]


def residual(text: str, spans: list[str]) -> str:
    for s in sorted(set(spans), key=len, reverse=True):
        text = text.replace(s, " ")
    return text


def loops(text: str) -> bool:
    joined = "".join(text.split())
    return any(len(set(m.group(1))) > 1 for m in LOOP.finditer(joined)) or RUN.search(joined) is not None


def digit_runs(text: str) -> Counter[str]:
    """Every run of digits, inside words too, full-width digits read as ASCII."""
    return Counter(DIGITS.findall(nfkc(text)))


def placed(hyp: str, ref: str, outputs: list[str]) -> tuple[int, int]:
    """(groups found in both, groups whose relative positions agree within TOLERANCE)."""
    both = good = h = r = 0
    for o in outputs:
        i, j = hyp.find(o, h), ref.find(o, r)
        if i < 0 or j < 0:
            continue
        both += 1
        good += abs(i / max(1, len(hyp) - len(o)) - j / max(1, len(ref) - len(o))) <= TOLERANCE
        h, r = i + len(o), j + len(o)
    return both, good


def check(source: str, hyp: str) -> dict[str, int]:
    """One output's counts."""
    spans = spans_of(source)
    joined = "\0".join(spans)
    rest, src_rest = residual(hyp, spans), residual(source, spans)
    have, want = Counter(NUMBER.findall(nfkc(rest))), Counter(NUMBER.findall(nfkc(src_rest)))
    return {
        "fragment": int(rest.count("{") > src_rest.count("{") or rest.count("}") > src_rest.count("}")),
        "spans_kept": int(
            bool(spans)
            and all(hyp.count(s) == joined.count(s) for s in set(spans))
            and TAG.findall(hyp) == TAG.findall(joined)
        ),
        "has_spans": int(bool(spans)),
        "numbers": sum(want.values()),
        "numbers_kept": sum((want & have).values()),
        "numbers_added": sum((have - want).values()),
        "has_numbers": int(bool(want)),
        "loop": int(loops(hyp) and not loops(source)),
    }


def measure(engine: Engine, data: list[tuple[str, str | None]], beam: int = 1) -> dict[str, Any]:
    """Totals over the lines, the tested lines' placement accuracy and chrF, and the recovery paths taken."""
    paths: list[str] = []
    engine._on_spans = paths.extend  # the code before has no such hook: nothing is counted there
    t0 = time.perf_counter()
    hyps = []
    for i in range(0, len(data), 32):
        hyps += [t.text for t in engine.translate_now([s for s, _ in data[i : i + 32]], Options(beam_size=beam))]
    seconds = time.perf_counter() - t0
    totals: Counter[str] = Counter()
    both = good = 0
    for (source, ref), hyp in zip(data, hyps, strict=True):
        totals.update(check(source, hyp))
        if ref is not None:
            groups = mask(source, find_spans(source)).outputs
            b, g = placed(hyp, ref, groups)
            both, good = both + b, good + g
    refs = [(r, h) for (_, r), h in zip(data, hyps, strict=True) if r is not None]
    chrf = sacrebleu.corpus_chrf([h for _, h in refs], [[r for r, _ in refs]]).score
    return {
        "totals": dict(totals), "placement": 100 * good / max(1, both), "chrF": chrf, "paths": dict(Counter(paths)),
        "seconds": seconds, "lines": len(data), "written": len(WRITTEN),
        "outputs": {s: h for (s, _), h in zip(data, hyps, strict=True) if s in WRITTEN},
        "looping": [(s, r, h) for (s, r), h in zip(data, hyps, strict=True) if loops(h) and not loops(s)],
    }  # fmt: skip


def redecoded(engine: Engine, looping: list, beam: int) -> tuple[int, float, float]:
    """The looping lines decoded again with a beam: (loops left, chrF of the greedy outputs, chrF of the beam's),
    over the looping lines that have a reference."""
    again = [t.text for t in engine.translate_now([s for s, _, _ in looping], Options(beam_size=beam))]
    left = sum(loops(h) and not loops(s) for (s, _, _), h in zip(looping, again, strict=True))
    scored = [(r, h, a) for (_, r, h), a in zip(looping, again, strict=True) if r is not None]
    refs = [[r for r, _, _ in scored]]
    greedy = sacrebleu.corpus_chrf([h for _, h, _ in scored], refs).score
    return left, greedy, sacrebleu.corpus_chrf([a for _, _, a in scored], refs).score


def split(pair: str) -> list[tuple[str, str]]:
    """The pair's whole test split, (source, reference)."""
    path = CORPUS.parent.parent / pair / "test.tsv"
    return [(ln.split("\t")[0], ln.split("\t")[1]) for ln in path.read_text(encoding="utf-8").splitlines()]


def held_out(n: int) -> list[int]:
    """The indices of the split that bench/common.py's ``pairs`` samples (the same draw)."""
    return random.Random(0).sample(range(n), min(HELD_OUT, n))


def translated(engine: Engine, sources: list[str], options: Options) -> list[str]:
    """The sources through ``Engine.translate_now`` in batches of 32, with progress on stderr."""
    out: list[str] = []
    for i in range(0, len(sources), 32):
        out += [t.text for t in engine.translate_now(sources[i : i + 32], options)]
        print(f"\r{len(out)}/{len(sources)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return out


def split_outputs(pairs: tuple[str, ...], options: Options, trials: bool = False) -> dict[str, Any]:
    """Each pair's test split translated with ``options``: outputs and seconds; with ``trials``, the repetition
    guards of :data:`GUARDS` tried too (:func:`tried`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        engine = Engine.load(MODEL_BUNDLES / pair, Settings(threads=1))
        engine.warm_up()
        data = split(pair)
        t0 = time.perf_counter()
        hyps = translated(engine, [s for s, _ in data], options)
        out[pair] = {"outputs": hyps, "seconds": time.perf_counter() - t0}
        if trials:
            out[pair]["trials"] = tried(engine, data)
    return out


def guarded(request: Any, guard: Any, *args: Any, **kwargs: Any) -> Any:
    """``Engine._request`` under ``guard``: the penalty on every text."""
    return guard.applied(request(*args, **kwargs))


def tried(engine: Engine, data: list[tuple[str, str]]) -> dict[str, Any]:
    """The split without a guard; each guard of :data:`GUARDS` on the outputs that loop (loops left, chrF of the
    whole split with their outputs); each penalty of :data:`EVERYWHERE` on every held-out text (loops, chrF)."""
    from service.serving.unlooping import Guard

    plain = translated(engine, [s for s, _ in data], Options(guard=None))
    looping = [i for i, h in enumerate(plain) if loops(h) and not loops(data[i][0])]
    refs = [[r for _, r in data]]
    out: dict[str, Any] = {"plain": plain, "looping": len(looping), "guards": {}, "everywhere": {}}
    for label, fields in GUARDS.items():
        again = translated(engine, [data[i][0] for i in looping], Options(guard=Guard(**fields)))
        hyps = list(plain)
        for i, h in zip(looping, again, strict=True):
            hyps[i] = h
        left = sum(loops(h) and not loops(data[i][0]) for i, h in zip(looping, again, strict=True))
        out["guards"][label] = {"left": left, "chrF_split": sacrebleu.corpus_chrf(hyps, refs).score}
    sample = held_out(len(data))
    request = engine._request
    for label, fields in EVERYWHERE.items():
        engine._request = partial(guarded, request, Guard(**fields))  # type: ignore[method-assign]
        hyps = translated(engine, [data[i][0] for i in sample], Options(guard=None))
        engine._request = request  # type: ignore[method-assign]
        refs_ = [[data[i][1] for i in sample]]
        out["everywhere"][label] = {
            "loops": sum(loops(h) and not loops(data[i][0]) for i, h in zip(sample, hyps, strict=True)),
            "chrF": sacrebleu.corpus_chrf(hyps, refs_).score,
        }
    return out


def guards(data: list[tuple[str, str]], hyps: list[str]) -> dict[str, float]:
    """Loops and digits on the held-out texts, chrF on them and on the whole split."""
    sample = [(data[i], hyps[i]) for i in held_out(len(data))]
    with_digits = [(s, h) for (s, _), h in sample if digit_runs(s)]
    return {
        "texts": len(sample), "loops": sum(loops(h) and not loops(s) for (s, _), h in sample),
        "digits": len(with_digits), "kept": sum(not (digit_runs(s) - digit_runs(h)) for s, h in with_digits),
        "made_up": sum(sum((digit_runs(h) - digit_runs(s)).values()) for s, h in with_digits),
        "numerals": sum(bool(digit_runs(h)) for (s, _), h in sample if not digit_runs(s)),
        "chrF": sacrebleu.corpus_chrf([h for _, h in sample], [[r for (_, r), _ in sample]]).score,
        "chrF_split": sacrebleu.corpus_chrf(hyps, [[r for _, r in data]]).score, "lines": len(data),
    }  # fmt: skip


def guard_row(label: str, pair: str, g: dict[str, float]) -> str:
    return (
        f"| {pair} | {label} | {g['loops']} ({100 * g['loops'] / g['texts']:.1f} %) | "
        f"{100 * g['kept'] / g['digits']:.1f} ({g['kept']} / {g['digits']}) | {g['made_up']} | {g['numerals']} | "
        f"{g['chrF']:.2f} | {g['chrF_split']:.2f} |"
    )


def trial_rows(pair: str, t: dict[str, Any], plain: dict[str, float]) -> list[str]:
    """The guards tried on one pair's looping outputs, and the penalties tried on every held-out text."""
    rows = [
        f"| {pair} | {label}, the looping outputs again | {g['left']} of {t['looping']} | {g['chrF_split']:.2f} | – |"
        for label, g in t["guards"].items()
    ]
    rows += [
        f"| {pair} | {label}, every text | – | – | {g['chrF']:.2f} ({g['loops']} loops) |"
        for label, g in t["everywhere"].items()
    ]
    none = (
        f"| {pair} | none | {t['looping']} | {plain['chrF_split']:.2f} | {plain['chrF']:.2f} ({plain['loops']} loops) |"
    )
    return [none, *rows]


def write_guards(before: dict[str, Any], after: dict[str, Any]) -> None:
    lines_ = [
        "### Loops, digits and chrF on the whole test split (`--split`)",
        "",
        "`ATTNSERVE_REPETITION_GUARD=true python bench/spans_whole.py --split --save after.json --trials`, then "
        f"`python bench/spans_whole.py --split --before before.json --after after.json`, on {machine()} (shared "
        f"with other jobs); {versions('onnxruntime')}; `before.json` from `python bench/spans_whole.py --split --save "
        "before.json` in a checkout of the code before (commit 5afc8ae, with this bench script). Each shipped pair's "
        "whole test split (2,803 en-ja and 3,297 en-de lines) through `Engine.translate_now` with "
        f"default options (greedy, one thread); loops and digits on the {HELD_OUT} held-out texts that "
        "bench/common.py's `pairs` samples from it.",
        "",
        "- *loops*: outputs that repeat a stretch of 2–20 characters three times or more in a row, or one letter or "
        "ideograph four times or more, where the source does not (`service/text/repetition.py`'s rule).",
        "- *digits kept*: of the held-out texts with digits, those whose every run of digits (inside words too, "
        "full-width digits read as ASCII) is in the output at least as often; *made up*: runs of digits in those "
        "outputs that their source does not have; *numerals*: outputs with digits among the texts without any "
        "(the model's numerals for number words: 2月 for February, 1つ for one).",
        "",
        "| pair | code | loops | digits kept % | made up | numerals | chrF (held-out) | chrF (whole split) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    trials = []
    for pair in after:
        data = split(pair)
        if pair in before:
            lines_.append(guard_row("before", pair, guards(data, before[pair]["outputs"])))
        lines_.append(guard_row("after (the service)", pair, guards(data, after[pair]["outputs"])))
        if "trials" in after[pair]:
            trials += trial_rows(pair, after[pair]["trials"], guards(data, after[pair]["trials"]["plain"]))
    if trials:
        lines_ += [
            "",
            "Repetition guards tried (the after code without its guard, then each guard on the outputs that loop on "
            "the whole split; and two penalties on every held-out text, as a CTranslate2 or transformers user sets "
            "them):",
            "",
            "| pair | guard | loops left (whole split) | chrF (whole split) | chrF (held-out) |",
            "|---|---|---:|---:|---:|",
            *trials,
        ]
    write_section("spans-guards", "\n".join(lines_))
    print("\n".join(lines_))


def row(label: str, m: dict) -> str:
    t = m["totals"]
    return (
        f"| {label} | {t.get('fragment', 0)} | {t.get('spans_kept', 0)} / {t['has_spans']} | {m['placement']:.1f} | "
        f"{100 * t.get('numbers_kept', 0) / max(1, t['numbers']):.1f} ({t.get('numbers_kept', 0)} / {t['numbers']}) | "
        f"{t.get('numbers_added', 0)} | {t.get('loop', 0)} | {m['chrF']:.1f} | {m['seconds']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundle", type=Path, default=EN_JA)
    parser.add_argument("--save", type=Path, help="measure this checkout and save the figures here")
    parser.add_argument("--before", type=Path, help="the saved figures of the code before")
    parser.add_argument("--split", action="store_true", help="each shipped pair's whole test split instead")
    parser.add_argument("--trials", action="store_true", help="with --split --save: try the repetition guards too")
    parser.add_argument("--after", type=Path, help="with --split: the saved figures of this code (--save --trials)")
    args = parser.parse_args()
    if args.split:
        if args.after:
            outputs = json.loads(args.after.read_text())
        else:
            outputs = split_outputs(SPLIT_PAIRS, Options(), trials=args.trials or not args.save)
        if args.save:
            args.save.write_text(json.dumps(outputs, ensure_ascii=False))
            return
        write_guards(json.loads(args.before.read_text()) if args.before else {}, outputs)
        return
    engine = Engine.load(args.bundle, Settings(threads=1))
    engine.warm_up()
    data = lines()
    if args.save:
        args.save.write_text(json.dumps(measure(engine, data), ensure_ascii=False))
        return
    after = measure(engine, data)
    engine.text.numbers = False
    unmasked = measure(engine, data)
    engine.text.numbers = True
    before = json.loads(args.before.read_text()) if args.before else None
    looping = after["looping"]
    assert isinstance(looping, list)
    write(data, before, after, unmasked, redecoded(engine, looping, 4))


def write(data: list, before: dict | None, after: dict, unmasked: dict, beam: tuple[int, float, float]) -> None:
    n_ref = sum(r is not None for _, r in data)
    lines_ = [
        "## Whole outputs: broken stand-ins, numbers, repetition (bench/spans_whole.py)",
        "",
        f"`python bench/spans_whole.py --before before.json` on {machine()}; {versions('onnxruntime')}; "
        f"`before.json` from `python bench/spans_whole.py --save before.json` in a checkout of the code before "
        f"(commit 6e880e6). The test split's {n_ref} lines with a pattern span or a number, and the "
        f"{len(WRITTEN)} lines of `WRITTEN` (several inline tags and format directives, like the held-out "
        "multi-tag line; no reference), through `Engine.translate_now`, greedy, model/bundles/en-ja, one thread.",
        "",
        "- *fragments*: outputs with a brace that neither a span nor the source's own text has (a stand-in or a "
        "piece of one: `{4`, `7}`, `{lgreset}`); goal 0.",
        "- *spans kept*: lines with a pattern span whose every span (numbers aside) is in the output as often as in "
        "the source, with the tags in the source's order.",
        f"- *placement*: span groups found in both the output and the human translation whose relative position is "
        f"within {TOLERANCE} of the reference's (test lines only).",
        "- *numbers kept*: of the source's numbers outside other spans, the share in the output; *added*: numbers in "
        "the output that the source does not have.",
        "- *loops*: outputs that repeat a stretch of 2–20 characters three times or more in a row where the source "
        "does not (`service/text/repetition.py`'s rule, flagged in `return_details`).",
        "",
        "| code | fragments | spans kept | placement % | numbers kept % | numbers added | loops | chrF (test lines) "
        "| seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    if before:
        lines_.append(row("before: no check, numbers left to the model", before))
    lines_.append(row("after: numbers masked, checked and recovered (the service)", after))
    lines_.append(row("after, numbers left to the model (`TextPipeline.numbers = False`)", unmasked))
    paths = after["paths"]
    total = sum(paths.values())
    lines_ += [
        "",
        f"Paths of the service's {total} sentences with spans: "
        + ", ".join(f"`{p}` {paths.get(p, 0)}" for p in ("decoded", "constrained", "attention", "appended"))
        + ".",
        "",
        f"Re-decoding the {len(after['looping'])} looping outputs once with beam 4 (the repetition-aware setting "
        f"tried): {beam[0]} still loop; chrF of those with a reference {beam[1]:.1f} greedy against {beam[2]:.1f} "
        "with the beam.",
        "",
        "The held-out multi-tag line, before and after:",
        "",
    ]
    line = WRITTEN[0]
    if before:
        lines_.append(f"- before: `{before['outputs'][line]}`")
    lines_.append(f"- after: `{after['outputs'][line]}`")
    write_section("spans-whole", "\n".join(lines_))
    print("\n".join(lines_))


if __name__ == "__main__":
    main()
