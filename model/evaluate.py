"""Score a bundle on the corpus' test split: chrF (primary) and BLEU with sacrebleu, greedy and beam 4, decoding
through the bundle with the service's own decoder; and a translation-memory baseline (for each test source, the
target of the most similar training source by fuzzy match — what localization tools offer without MT).

BLEU on a language written without spaces (Japanese, Chinese, Thai...) uses sacrebleu's character tokenization
(``tokenize="char"``): no word segmenter is needed and the score does not depend on one; on the others, sacrebleu's
default (``13a``). chrF is sacrebleu's default chrF2 (character 6-grams, β = 2).

    attnserve evaluate model/bundles/en-ja --corpus ~/.cache/attnserve/corpus/en-ja --write
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import sacrebleu
from rapidfuzz import fuzz, process
from tqdm import tqdm

from model.data import read_pairs
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.manifest import MANIFEST, Manifest
from service.runtime.runner import Runner, open_runner

log = logging.getLogger(__name__)

# Common UI strings for the model card (none is taken from the test split on purpose; some are in training data).
UI_STRINGS = [
    "Open file",
    "Save as…",
    "Delete the selected files?",
    "Settings",
    "Cancel",
    "Close window",
    "Print the current document",
    "Could not open %s: permission denied",
    "The file {0} already exists. Replace it?",
    "Undo",
    "Copy to clipboard",
    "Search",
    "Preferences",
    "About this application",
    "Quit",
    "New folder",
    "Rename file",
    "Show hidden files",
    "Downloading %d files…",
    "An error occurred while saving the document.",
]


def decode_tokens(runner: Runner, texts: list[str], beam_size: int, batch_size: int = 48) -> list[list[int]]:
    """Each text's best hypothesis' tokens: batched decoding with the service's decoder, sorted by length to cut
    padding."""
    tok = runner.bundle.tokenizer
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[list[int]] = [[] for _ in texts]
    for start in tqdm(range(0, len(order), batch_size), desc=f"beam {beam_size}", unit="batch", leave=False):
        idx = order[start : start + batch_size]
        requests = []
        for i in idx:
            src = tok.encode_source(texts[i])[: runner.spec.max_positions]
            prefix = tok.target_prefix  # forced, as the service forces it
            length = min(2 * len(src) + 10 + len(prefix), 256)
            requests.append(DecodeRequest(src=src, beam_size=beam_size, max_length=length, prefix=prefix))
        for i, result in zip(idx, decode(runner, requests), strict=True):
            out[i] = list(result.hypotheses[0].tokens)
    return out


def translate(runner: Runner, texts: list[str], beam_size: int, batch_size: int = 48) -> list[str]:
    """Each text's best translation (:func:`decode_tokens`, detokenized)."""
    tok = runner.bundle.tokenizer
    return [tok.decode(t) for t in decode_tokens(runner, texts, beam_size, batch_size)]


def translation_memory(train: list[tuple[str, str]], sources: list[str]) -> list[str]:
    """For each source, the target of the most similar training source (rapidfuzz's ratio: edit-distance based)."""
    train_sources = [s for s, _ in train]
    out = []
    for s in tqdm(sources, desc="translation memory", unit="text", leave=False):
        match = process.extractOne(s, train_sources, scorer=fuzz.ratio)
        out.append(train[match[2]][1] if match else "")
    return out


UNSPACED = {"ja", "zh", "th", "lo", "km", "my"}  # languages written without spaces between words


def scores(hyps: list[str], refs: list[str], target_lang: str = "ja") -> dict[str, float]:
    tokenize = "char" if target_lang.split("-")[0] in UNSPACED else "13a"
    return {
        "chrF": round(float(sacrebleu.corpus_chrf(hyps, [refs]).score), 2),
        "BLEU": round(float(sacrebleu.corpus_bleu(hyps, [refs], tokenize=tokenize).score), 2),
    }


def evaluate(
    bundle_dir: Path, corpus: Path, *, limit: int | None = None, write: bool = False, split: str = "test"
) -> dict[str, Any]:
    """Score greedy, beam 4 (on the float32 graphs, and on the int8 ones when the bundle has them) and the TM
    baseline; print a table; with ``write``, record them in the manifest."""
    if write and split != "test":
        raise ValueError("only test-split scores go into the manifest")
    test = read_pairs(corpus / f"{split}.tsv")[:limit]
    sources, refs = [s for s, _ in test], [t for _, t in test]
    bundle = load_bundle(bundle_dir)
    runner = open_runner(bundle, "cpu", 0, role="fast_decoder")  # what /translate decodes on (the exact graphs' tokens)
    results: dict[str, Any] = {}
    for variant in ["float32", *(v for v in bundle.variants if v == "int8")]:
        variant_runner = runner if variant == "float32" else open_runner(bundle, "cpu", 0, variant)
        for name, beam in (("greedy", 1), ("beam 4", 4)):
            t0 = time.perf_counter()
            hyps = translate(variant_runner, sources, beam)
            label = name if variant == "float32" else f"{name}, {variant}"
            results[label] = {**scores(hyps, refs, bundle.target_lang), "seconds": round(time.perf_counter() - t0, 1)}
    memory = translation_memory(read_pairs(corpus / "train.tsv"), sources)
    results["translation memory"] = scores(memory, refs, bundle.target_lang)
    samples = translate(runner, UI_STRINGS, 4)
    report = {
        "test_set": f"{corpus.name} {split} split ({len(test)} pairs, {corpus / f'{split}.tsv'})",
        "results": results,
        "samples": dict(zip(UI_STRINGS, samples, strict=True)),
    }
    print(json.dumps(report, indent=2, ensure_ascii=False))
    if write:
        manifest = Manifest.read(bundle_dir)
        command = f"attnserve evaluate {bundle_dir} --corpus {corpus}" + (f" --limit {limit}" if limit else "")
        manifest.scores = [
            {"metric": metric, "value": value, "decoding": name, "test_set": report["test_set"], "command": command}
            for name, r in results.items()
            for metric, value in r.items()
            if metric != "seconds"
        ]
        manifest.write(bundle_dir)
        log.info("wrote the scores into %s", bundle_dir / MANIFEST)
    return report
