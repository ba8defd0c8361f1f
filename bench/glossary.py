"""Glossary terms on the held-out split: masking (the service) against constrained decoding and the model alone.
Writes docs/BENCHMARKS.md's ``glossary`` section.

    python bench/glossary.py [--bundle model/bundles/en-ja] [--n 1000] [--rounds 3]

The glossary is mined from train.tsv, not picked by hand: English terms of one to three words found in many
training sources whose human translations consistently contain one Japanese string (the character n-gram most
associated with the term, by Dice coefficient, kept above a consistency threshold). The test lines that contain a
term, and no other protected span, are translated each way in interleaved rounds:

- masking: ``Engine.translate_now`` with ``Options(glossary=...)``, as the service enforces glossaries;
- constrained decoding: greedy decoding on the exact graphs that forces the target term's tokens into the
  hypothesis at the step whose cross-attention (last layer, heads averaged) first peaks inside the source term,
  and forces the terms still missing when the model would end (so every term is in the output); variants: the
  trigger only where the model is unsure of its own token, and no trigger (the terms forced at the end);
- the model alone, without the glossary; and the model first, masking only the lines whose output misses a term.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import sacrebleu
from common import CORPUS, machine, versions, write_section
from spans import TOLERANCE, placed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from service.decoding.step_runner import StepRunner
from service.runtime.bundle import Tokenizer
from service.runtime.runner import StepInput
from service.serving.engine import Engine, Options
from service.settings import EN_JA, Settings
from service.text.spans import find_spans
from service.text.words import cuts

TRAIN = CORPUS.with_name("train.tsv")
MIN_LINES = 50  # a term's training sources at least
CONSISTENCY = 0.8  # share of those sources whose translation holds the target term, at least
MIN_DICE = 0.5  # association of term and target term over the whole corpus, at least
SAMPLE = 80  # training lines a term's target candidates are counted on
TARGET_CHARS = range(2, 11)  # lengths of the Japanese candidates
BATCH = 32
Scores = tuple[float, float, float, float, float, float]  # term kept, as words, placement, chrF, added spaces, texts/s
GATE = 0.5  # the gated variant's attention trigger: only where the model's own token is less likely than this
STOPWORDS = frozenset(
    "a an the of to in on at by for from with and or not no is are be been was were it its this that these those "
    "as if then than into out up all any can could will would should may might must do does did has have had you "
    "your we our they their he she his her i me my there here which what when where who how so".split()
)
WORD = re.compile(r"[A-Za-z]+")


def terms_of(source: str, max_words: int = 3) -> set[str]:
    """The candidate terms of one source: runs of one to ``max_words`` words separated by single spaces, neither
    starting nor ending with a stopword; single words of four letters at least."""
    words = [(m.start(), m.end()) for m in WORD.finditer(source)]
    out = set()
    for i in range(len(words)):
        for j in range(i, min(i + max_words, len(words))):
            if j > i and source[words[j - 1][1] : words[j][0]] != " ":
                break
            first, last = source[slice(*words[i])], source[slice(*words[j])]
            if first.lower() in STOPWORDS or last.lower() in STOPWORDS:
                continue
            if i == j and len(first) < 4:
                continue
            out.add(source[words[i][0] : words[j][1]])
    return out


def ngrams(text: str, lengths: Iterable[int] = TARGET_CHARS) -> set[str]:
    """Every character n-gram of ``text`` of the given lengths."""
    return {text[i : i + n] for n in lengths for i in range(len(text) - n + 1)}


def japanese(s: str) -> bool:
    """Whether ``s`` is a target term worth enforcing: no whitespace, no ASCII, no punctuation at its edges."""
    edges = "。、・「」（）"
    return (
        s.isprintable() and not any(c.isspace() or c.isascii() for c in s) and s[0] not in edges and s[-1] not in edges
    )


def mine(
    pairs: Sequence[tuple[str, str]],
    min_lines: int = MIN_LINES,
    consistency: float = CONSISTENCY,
    min_dice: float = MIN_DICE,
) -> dict[str, str]:
    """Source term → target term mined from parallel lines by co-occurrence.

    Args:
        pairs: (source, human translation) lines.
        min_lines: sources a term occurs in, at least.
        consistency: share of the term's sampled translations that contain the target term, at least.
        min_dice: Dice coefficient of the term and the target term over every line, at least.

    Returns:
        For each kept term, the Japanese string most associated with it.
    """
    lines_of: dict[str, list[int]] = defaultdict(list)
    for i, (source, _) in enumerate(pairs):
        for t in terms_of(source):
            lines_of[t].append(i)
    candidates: dict[str, tuple[int, Counter[str]]] = {}
    for term, lines in lines_of.items():
        if len(lines) < min_lines:
            continue
        sample = lines[:: max(1, len(lines) // SAMPLE)][:SAMPLE]
        counts = Counter(g for i in sample for g in ngrams(pairs[i][1]) if japanese(g))
        kept = Counter({g: c for g, c in counts.items() if c >= consistency * len(sample)})
        if kept:
            candidates[term] = (len(lines), Counter({g: c / len(sample) for g, c in kept.items()}))
    wanted = {g for _, shares in candidates.values() for g in shares}
    df = Counter(g for _, target in pairs for g in ngrams(target) if g in wanted)
    out = {}
    for term, (n, shares) in candidates.items():
        dice = {g: 2 * share * n / (n + df[g]) for g, share in shares.items()}
        best = max(dice, key=lambda g: (dice[g], len(g)))
        if dice[best] >= min_dice:
            out[term] = best
    return out


@dataclass
class Row:
    """A test line with the glossary terms it contains (as the service finds them)."""

    source: str
    reference: str
    terms: list[tuple[int, int, str]]  # (start, end, target term) in the source


def lines_with_terms(
    pairs: Iterable[tuple[str, str]], glossary: Mapping[str, str], vocabulary: Collection[str] = ()
) -> list[Row]:
    """The lines with at least one glossary term and no other protected span."""
    out = []
    for source, reference in pairs:
        spans = find_spans(source, vocabulary, glossary)
        if spans and all(s.kind == "glossary" for s in spans):
            out.append(Row(source, reference, [(s.start, s.end, s.output) for s in spans]))
    return out


def kept_rate(rows: Sequence[Row], hyps: Sequence[str]) -> float:
    """Percent of the rows' term occurrences whose target term the output holds (each occurrence counted)."""
    total = missing = 0
    for row, hyp in zip(rows, hyps, strict=True):
        need = Counter(t for _, _, t in row.terms)
        for t, n in need.items():
            total += n
            missing += max(0, n - hyp.count(t))
    return 100 * (1 - missing / max(1, total))


def kept_as_words(rows: Sequence[Row], hyps: Sequence[str], lang: str = "ja") -> float:
    """Percent of the rows' term occurrences whose target term the output holds as whole words, by the target
    language's word rule (service/text/words.py): not glued into a longer word of a text without spaces."""
    total = missing = 0
    for row, hyp in zip(rows, hyps, strict=True):
        inside = cuts(hyp, lang)
        for t, n in Counter(t for _, _, t in row.terms).items():
            starts = [i for i in range(len(hyp)) if hyp.startswith(t, i)]
            whole = sum(i not in inside and i + len(t) not in inside for i in starts)
            total += n
            missing += max(0, n - whole)
    return 100 * (1 - missing / max(1, total))


def spaced(rows: Sequence[Row], hyps: Sequence[str]) -> float:
    """Percent of outputs with more spaces than their reference (a term set apart in a text without spaces)."""
    return 100 * sum(h.count(" ") > r.reference.count(" ") for r, h in zip(rows, hyps, strict=True)) / len(rows)


def placement(rows: Sequence[Row], hyps: Sequence[str]) -> float:
    """Percent of the terms found in both output and reference whose relative positions agree (bench/spans.py's
    measure: within its TOLERANCE, as a fraction of the text's other characters)."""
    both = good = 0
    for row, hyp in zip(rows, hyps, strict=True):
        b, g = placed(hyp, row.reference, [t for _, _, t in row.terms])
        both, good = both + b, good + g
    return 100 * good / max(1, both)


def chrf(rows: Sequence[Row], hyps: Sequence[str]) -> float:
    return float(sacrebleu.corpus_chrf(list(hyps), [[r.reference for r in rows]]).score)


def term_ids(tok: Tokenizer, term: str) -> list[int]:
    """The target term's ids as they stand inside a sentence: without the word-start mark SentencePiece puts on a
    text's first piece (Japanese has no spaces); where the bare piece is not in the vocabulary, its characters."""
    sp = tok.target
    pieces = sp.encode(term, out_type=str)
    first = pieces[0].removeprefix("▁")
    if first == pieces[0]:
        pass
    elif not first:
        pieces = pieces[1:]
    elif sp.piece_to_id(first) != sp.unk_id():
        pieces[0] = first
    elif all(sp.piece_to_id(c) != sp.unk_id() for c in first):
        pieces[:1] = list(first)
    return [sp.piece_to_id(p) for p in pieces]


@dataclass
class Constraint:
    """One term occurrence to put in the output."""

    lo: int  # source token positions of the term, [lo, hi)
    hi: int
    ids: list[int]
    text: str


@dataclass
class State:
    """One row of a constrained greedy decode."""

    pending: list[Constraint]
    max_length: int
    tokens: list[int] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)  # forced ids still to emit
    met: Counter[str] = field(default_factory=Counter)  # per target term, occurrences forced or written
    done: bool = False

    def written(self, text: str) -> None:
        """Terms the model wrote itself are met: one pending occurrence for each one beyond those met."""
        for c in list(self.pending):
            if text.count(c.text) > self.met[c.text]:
                self.met[c.text] += 1
                self.pending.remove(c)


def constraints(tok: Tokenizer, row: Row) -> tuple[list[int], list[Constraint]]:
    """Source ids (with </s>) and each term's source token span and target ids."""
    assert tok.vocab is None, "SentencePiece's own ids only (a bundle of this project's, not an imported Marian)"
    proto = tok.source.encode(row.source, return_type="proto")
    out = []
    for start, end, target in row.terms:
        inside = [k for k, p in enumerate(proto.pieces) if p.begin < end and p.end > start]
        out.append(Constraint(inside[0], inside[-1] + 1, term_ids(tok, target), target))
    return [*(p.id for p in proto.pieces), tok.spec.eos_id], out


def choose(state: State, tok: Tokenizer, logits: np.ndarray, focus: int | None, gate: float = 1.0) -> int:
    """The row's next token: a forced one, the term whose source the step attends to (``focus``: the source
    position; None: never by attention) unless the model's own token has probability ``gate`` or more, the
    missing terms when the model would end or only they still fit, or the model's greedy choice."""
    spec = tok.spec
    if not state.queue:
        logits[spec.pad_id] = -np.inf
        choice = int(np.argmax(logits))
        hit = None if focus is None else next((c for c in state.pending if c.lo <= focus < c.hi), None)
        if hit is not None and gate < 1 and 1 / np.exp(logits - logits[choice]).sum() >= gate:
            hit = None  # the model is sure of its own word (often a particle after the term's source)
        room = state.max_length - len(state.tokens) - 1  # the last slot is </s>'s
        if hit is not None:
            state.pending.remove(hit)
            state.met[hit.text] += 1
            state.queue = list(hit.ids)
        elif state.pending and (choice == spec.eos_id or room <= sum(len(c.ids) for c in state.pending)):
            state.queue = [i for c in state.pending for i in c.ids]
            state.met.update(c.text for c in state.pending)
            state.pending = []
        else:
            return choice
    return state.queue.pop(0)


def constrained(  # long: one step loop
    runner: StepRunner, tok: Tokenizer, rows: Sequence[Row], attention: bool = True, gate: float = 1.0
) -> list[str]:
    """Greedy decoding of ``rows`` in one batch with their terms forced where cross-attention reaches them
    (``attention``; ``gate``: see :func:`choose`), else only when the model would end."""
    spec = runner.spec
    prepared = [constraints(tok, r) for r in rows]
    B, S = len(rows), max(len(src) for src, _ in prepared)
    ids = np.full((B, S), spec.pad_id, np.int64)
    mask = np.zeros((B, S), np.int64)
    states = []
    for b, (src, cons) in enumerate(prepared):
        ids[b, : len(src)], mask[b, : len(src)] = src, 1
        extra = sum(len(c.ids) for c in cons)
        states.append(State(cons, min(2 * len(src) + 10 + extra, spec.max_positions)))
    enc = runner.encode(ids, mask, np.broadcast_to(np.arange(S, dtype=np.int64), (B, S)).copy())
    empty = [runner.tensors.empty((B, spec.h, 0, spec.d_k)) for _ in range(spec.n_decoder_layers)]
    past_k, past_v = empty, list(empty)
    last = np.full((B, 1), spec.decoder_start_id, np.int64)
    for t in range(max(s.max_length for s in states)):
        out = runner.step(
            StepInput(last, np.full((B, 1), t, np.int64), mask, enc.cross_keys, enc.cross_values, past_k, past_v,
                      self_attention_mask=np.ones((B, t + 1), np.int64))
        )  # fmt: skip
        past_k, past_v = out.present_keys, out.present_values
        assert out.cross_attentions is not None, "constrained decoding needs the exact graphs' attention"
        focus = out.cross_attentions[-1].mean(axis=1).argmax(axis=1)
        for b, st in enumerate(states):
            if st.done:
                continue
            token = choose(st, tok, out.logits[b], int(focus[b]) if attention else None, gate)
            st.tokens.append(token)
            last[b, 0] = token
            st.done = token == spec.eos_id or len(st.tokens) >= st.max_length
            if st.pending and not st.queue:
                st.written(tok.decode(st.tokens))
        if all(s.done for s in states):
            break
    return [tok.decode(s.tokens) for s in states]


def by_masking(engine: Engine, rows: Sequence[Row], glossary: Mapping[str, str]) -> list[str]:
    """The service's way: the whole mined glossary as the request's glossary, in batches."""
    out = []
    for i in range(0, len(rows), BATCH):
        texts = [r.source for r in rows[i : i + BATCH]]
        out += [t.text for t in engine.translate_now(texts, Options(glossary=glossary))]
    return out


def by_fallback(engine: Engine, rows: Sequence[Row], glossary: Mapping[str, str]) -> list[str]:
    """The model alone first; masking for the lines whose output misses a term."""
    out = by_model(engine, rows)
    missing = [i for i, (r, h) in enumerate(zip(rows, out, strict=True)) if kept_rate([r], [h]) < 100]
    for i, hyp in zip(missing, by_masking(engine, [rows[i] for i in missing], glossary), strict=True):
        out[i] = hyp
    return out


def by_model(engine: Engine, rows: Sequence[Row]) -> list[str]:
    out = []
    for i in range(0, len(rows), BATCH):
        out += [t.text for t in engine.translate_now([r.source for r in rows[i : i + BATCH]], Options())]
    return out


def by_constraints(engine: Engine, rows: Sequence[Row], attention: bool = True, gate: float = 1.0) -> list[str]:
    runner, tok = engine.runners.exact, engine.tokenizer
    ordered = sorted(range(len(rows)), key=lambda k: len(rows[k].source))  # similar lengths share a batch
    out: list[str] = [""] * len(rows)
    for i in range(0, len(rows), BATCH):
        chunk = ordered[i : i + BATCH]
        for k, hyp in zip(chunk, constrained(runner, tok, [rows[k] for k in chunk], attention, gate), strict=True):
            out[k] = hyp
    return out


def pairs_of(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cols = line.split("\t")
        if len(cols) >= 2:
            out.append((cols[0], cols[1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, default=EN_JA)
    parser.add_argument("--n", type=int, default=1000, help="test lines at most")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = Engine.load(args.bundle, Settings(threads=1))
    engine.warm_up()
    glossary = mine(pairs_of(TRAIN))
    rows = lines_with_terms(pairs_of(CORPUS), glossary, engine.text.vocabulary)[: args.n]
    methods = {
        "masking (the service)": lambda: by_masking(engine, rows, glossary),
        "constrained decoding (attention-triggered)": lambda: by_constraints(engine, rows),
        f"constrained decoding, triggered only below p = {GATE}": lambda: by_constraints(engine, rows, gate=GATE),
        "constrained decoding, terms forced only at the end": lambda: by_constraints(engine, rows, False),
        "the model alone (no glossary)": lambda: by_model(engine, rows),
        "the model first, masking where it misses a term": lambda: by_fallback(engine, rows, glossary),
    }
    hyps: dict[str, list[str]] = {}
    rates: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):  # interleaved: each round runs every method once
        for label, run in methods.items():
            t = time.perf_counter()
            hyps[label] = run()
            rates[label].append(len(rows) / (time.perf_counter() - t))
    load = os.getloadavg()[0]
    alone = hyps["the model alone (no glossary)"]
    hard = [i for i, (r, h) in enumerate(zip(rows, alone, strict=True)) if kept_rate([r], [h]) < 100]
    subset = {k: [h[i] for i in hard] for k, h in hyps.items()}
    tables = [scored(rows, hyps, rates), scored([rows[i] for i in hard], subset, {k: [math.nan] for k in hyps})]
    write(glossary, rows, len(hard), tables, args.rounds, load)


def scored(
    rows: Sequence[Row], hyps: Mapping[str, Sequence[str]], rates: Mapping[str, list[float]]
) -> dict[str, Scores]:
    """Per method: term kept, kept as words, term placement, chrF, added spaces, texts/s; and the human
    translations' figures."""
    out = {
        k: (
            kept_rate(rows, h),
            kept_as_words(rows, h),
            placement(rows, h),
            chrf(rows, h),
            spaced(rows, h),
            statistics.median(rates[k]),
        )
        for k, h in hyps.items()
    }
    human = [r.reference for r in rows]
    out["human translations"] = (
        kept_rate(rows, human),
        kept_as_words(rows, human),
        100.0,
        chrf(rows, human),
        0.0,
        math.nan,
    )
    return out


def write(glossary, rows, n_hard, tables, rounds, load) -> None:  # long: the section's text
    examples = sorted(glossary.items(), key=lambda kv: kv[0].lower())[:: max(1, len(glossary) // 8)][:8]
    lines = [
        "## Glossary terms: masking against constrained decoding",
        "",
        f"`python bench/glossary.py` on {machine()}; {versions('onnxruntime', 'sacrebleu')}. Greedy decoding of "
        f"model/bundles/en-ja, batches of {BATCH}, texts/s the median of {rounds} interleaved rounds "
        f"(load average {load:.1f}).",
        "",
        f"Glossary mined from train.tsv: {len(glossary)} English terms (one to three words, in at least {MIN_LINES} "
        f"training sources) whose translations hold one Japanese string in at least {100 * CONSISTENCY:.0f} % of "
        f"{SAMPLE} sampled lines, with a Dice coefficient of at least {MIN_DICE} over the corpus; e.g. "
        + ", ".join(f"{k} → {v}" for k, v in examples)
        + f". Test lines: the {len(rows)} of test.tsv that contain a term and no other protected span "
        f"({sum(len(r.terms) for r in rows)} term occurrences).",
        "",
    ]
    titles = ("All these lines:", f"The {n_hard} lines where the model alone misses a term (texts/s: above):")
    for title, table in zip(titles, tables, strict=True):
        lines += [
            title,
            "",
            "| method | term kept % | as whole words % | term placement % | chrF | outputs with added spaces % "
            "| texts/s |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for label, (kept, words, place, score, spaces, rate) in table.items():
            speed = "–" if math.isnan(rate) else f"{rate:.1f}"
            lines.append(f"| {label} | {kept:.1f} | {words:.1f} | {place:.1f} | {score:.1f} | {spaces:.1f} | {speed} |")
        lines.append("")
    lines += [
        "- *term kept*: of the term occurrences in the sources, the share whose target term the output holds (each "
        "occurrence counted); *as whole words*: of those, the share the output holds as whole words of the "
        "unspaced target, not glued into a longer word (service/text/words.py: MeCab with unidic-lite for Japanese, "
        "the `words` extra); *term placement*: of the terms found in both the output and the human translation, "
        f"the share whose position, as a fraction of the text's other characters, is within {TOLERANCE} of the "
        "reference's (bench/spans.py's measure); *added spaces*: outputs with more spaces than their reference;",
        "- masking: `Engine.translate_now` with the mined glossary as `Options(glossary=...)` (stand-ins, placed by "
        "cross-attention, exact graphs for these texts);",
        "- constrained decoding: greedy on the exact graphs (bench/glossary.py's step loop over `StepRunner`); at the "
        "first step whose cross-attention (last layer, heads averaged) peaks inside a source term, the target term's "
        "tokens are forced; a term the model writes itself counts as met; terms still missing when the model ends "
        "are forced before `</s>`, or as soon as only they still fit within the length limit (so every term is in "
        "the output); *triggered only below p*: the attention trigger fires only where the model's own token is "
        f"less likely than {GATE}; *terms forced only at the end*: the same without the attention trigger;",
        "- the model alone: `Engine.translate_now` without a glossary (the fast graphs); *the model first, masking "
        "where it misses a term*: that, then masking for the lines whose output lacks a term (on the lines of the "
        "second table it is masking, by construction).",
        "",
        'The choice and its trade-off: docs/API.md\'s glossary paragraph and the table "Tried, measured, not kept".',
    ]
    write_section("glossary", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
