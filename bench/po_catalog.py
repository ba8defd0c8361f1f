"""``attnserve translate-po`` on a real, held-out catalog: the Japanese catalogs of the handed packages' .debs, read
by the corpus code, kept to their test-split entries (the model never trained on them), their msgstrs emptied; the
command fills them, msgfmt judges the result, and chrF compares it with the packages' own translations.

    python bench/po_catalog.py [--packages util-linux-locales ...] [--write]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import polib
import sacrebleu
from common import write_section
from tqdm import tqdm

from model.corpus.extraction import CatalogEntry, catalog_lang_dir, lang_dir_matches, parse_mo
from model.corpus.fetching import find_debs, package_of
from model.corpus.split import split_of
from service.formats.directives import PRINTF, directives, keeps_directives

CACHE = Path.home() / ".cache" / "attnserve"
HEADER = {
    "Project-Id-Version": "attnserve held-out catalog",
    "Language": "",
    "MIME-Version": "1.0",
    "Content-Type": "text/plain; charset=UTF-8",
    "Content-Transfer-Encoding": "8bit",
    "Plural-Forms": "nplurals=INTEGER; plural=EXPRESSION;",
}


def deb_catalogs(deb: Path, lang: str) -> Iterator[tuple[str, list[CatalogEntry]]]:
    """The ``lang`` .mo catalogs of one .deb, as model.corpus.extraction finds them: (member path, entries)."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|*") as archive:
            for member in archive:
                name = member.name.removeprefix("./")
                lang_dir = catalog_lang_dir(name) if member.isfile() else None
                if lang_dir is not None and lang_dir_matches(lang_dir, lang):
                    try:
                        yield name, parse_mo(archive.extractfile(member).read())  # type: ignore[union-attr]
                    except ValueError:
                        continue
        proc.stdout.read()


def held_out(entry: CatalogEntry) -> bool:
    """Whether every English text of the entry is in the test split (a plural's msgid_plural is a source too)."""
    texts = [entry.msgid] + ([entry.msgid_plural] if entry.msgid_plural else [])
    return all(split_of(t) == "test" for t in texts) and all(entry.msgstrs) and not entry.msgid.startswith("_: ")


def build(debs: list[Path]) -> tuple[polib.POFile, polib.POFile]:
    """(the template to translate, the reference with the packages' translations), entries in the debs' order,
    each (msgctxt, msgid) once. ``c-format`` is set, as xgettext sets it, where the msgid has printf directives
    and the human translation keeps them (a literal ``100%`` is no directive)."""
    template, reference = polib.POFile(), polib.POFile()
    template.metadata = dict(HEADER)
    reference.metadata = {**HEADER, "Language": "ja", "Plural-Forms": "nplurals=1; plural=0;"}
    seen: set[tuple[str | None, str]] = set()
    for deb in tqdm(debs, desc="debs", unit="deb"):
        for path, entries in deb_catalogs(deb, "ja"):
            for e in entries:
                if (e.msgctxt, e.msgid) in seen or not held_out(e):
                    continue
                seen.add((e.msgctxt, e.msgid))
                plural = e.msgid_plural or ""
                source = plural or e.msgid
                flags = (
                    ["c-format"]
                    if directives(source, PRINTF) and keeps_directives(source, e.msgstrs[0], ["c-format"])
                    else []
                )
                common = {
                    "msgid": e.msgid,
                    "msgctxt": e.msgctxt,
                    "flags": flags,
                    "comment": f"{package_of(deb.name)}: {path}",
                }
                if plural:
                    template.append(polib.POEntry(**common, msgid_plural=plural, msgstr_plural={0: "", 1: ""}))
                    reference.append(polib.POEntry(**common, msgid_plural=plural, msgstr_plural={0: e.msgstrs[0]}))
                else:
                    template.append(polib.POEntry(**common, msgstr=""))
                    reference.append(polib.POEntry(**common, msgstr=e.msgstrs[0]))
    return template, reference


def msgfmt(path: Path) -> tuple[int, str]:
    """``msgfmt --check --use-fuzzy``'s exit status and its errors (header warnings left out)."""
    done = subprocess.run(
        ["msgfmt", "--check", "--use-fuzzy", "-o", "/dev/null", str(path)], capture_output=True, text=True
    )
    return done.returncode, "\n".join(ln for ln in done.stderr.splitlines() if "warning:" not in ln)


def translation(entry: polib.POEntry) -> str:
    return entry.msgstr_plural[0] if entry.msgid_plural else entry.msgstr


def main() -> None:  # long: build, translate, judge and report in one readable sequence
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--debs-dir", type=Path, default=CACHE / "debs")
    parser.add_argument("--packages", nargs="*", help="only these packages (default: every .deb in --debs-dir)")
    parser.add_argument("--out", type=Path, default=CACHE / "po-bench")
    parser.add_argument("--write", action="store_true", help="write the section of docs/BENCHMARKS.md")
    args = parser.parse_args()
    debs = [d for d in find_debs(args.debs_dir) if not args.packages or package_of(d.name) in args.packages]
    args.out.mkdir(parents=True, exist_ok=True)
    template, reference = build(debs)
    pot, ref, out = args.out / "held-out.pot", args.out / "reference.ja.po", args.out / "held-out.ja.po"
    template.save(str(pot))
    reference.save(str(ref))
    command = ["attnserve", "translate-po", pot.name, "-o", out.name, "--source", "en", "--target", "ja"]
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("attnserve")), *command[1:]],
        check=True,
        cwd=args.out,
        stderr=subprocess.PIPE,
        text=True,
    )
    summary = done.stderr.strip().splitlines()[-1]  # the command's own count of what it filled and kept
    seconds = time.perf_counter() - t0
    status, errors = msgfmt(out)
    ref_status, _ = msgfmt(ref)
    filled = polib.pofile(str(out))
    live = [e for e in filled if not e.obsolete]
    assert len(live) == len(reference)
    empty = sum(not translation(e) for e in live)
    kept = [e for e in live if translation(e) == (e.msgid_plural or e.msgid)]
    hyps = [translation(e) for e in live]
    refs = [translation(e) for e in reference]
    chrf = sacrebleu.corpus_chrf(hyps, [refs]).score
    pairs = [(h, r) for h, r, e in zip(hyps, refs, live, strict=True) if e not in kept]
    chrf_translated = sacrebleu.corpus_chrf([h for h, _ in pairs], [[r for _, r in pairs]]).score
    flagged = sum("c-format" in e.flags for e in reference)
    plurals = sum(bool(e.msgid_plural) for e in reference)
    packages = len({e.comment.split(":")[0] for e in reference})
    print(f"{len(live)} entries, {empty} empty, msgfmt {status}, chrF {chrf:.1f}, {seconds:.0f} s")
    if status:
        print(errors)
    which = (
        " ".join(args.packages) if args.packages else f"all {len(debs)} .debs of ../shared/data/gettext-packages.txt"
    )
    verdict, share, where = (
        {True: "clean", False: "FAILED"},
        len(kept) / len(live),
        str(args.out).replace(str(Path.home()), "~"),
    )
    body = f"""## translate-po on a held-out catalog (bench/po_catalog.py)

`{shlex.join(["python", "bench/po_catalog.py", *(["--packages", *args.packages] if args.packages else []), "--write"])}`
builds the catalog with the corpus code (model/corpus: the .debs' Japanese `.mo` catalogs, the train/dev/test split)
from {which}: every entry whose English texts are all in the **test split** (never trained on) and that the package
translates, once per (msgctxt, msgid), the msgstrs emptied and the header left as a template's (`Language` and
`Plural-Forms` empty). `c-format` is set where the msgid has printf directives that the package's own translation
keeps, as xgettext sets it, so that msgfmt checks them. Then `{shlex.join(command)}` in `{where}` (the shipped
bundle, greedy, decoded in the process; {seconds:.0f} s on this machine, model load included).

| | |
|---|---|
| packages with held-out entries | {packages} |
| entries (plural / c-format) | {len(live)} ({plurals} / {flagged}) |
| msgstrs left empty | {empty} |
| `msgfmt --check --use-fuzzy`: output (reference) | {verdict[status == 0]} ({verdict[ref_status == 0]}) |
| the command's summary | {summary.split(";")[0]} |
| msgstrs equal to their msgid (the model's copy, or a lost directive) | {len(kept)} ({share:.1%}) |
| chrF against the packages' translations, every entry | {chrf:.1f} |
| chrF without the msgstrs equal to their msgid | {chrf_translated:.1f} |

chrF is sacrebleu's `corpus_chrf` (character 6-grams, β = 2) of each filled msgstr (a plural entry's msgstr[0])
against the package's msgstr. MODEL_CARD.md has the model's chrF on the test split's cleaned pairs; this catalog
also holds what the corpus cleaning drops (names, code, long texts).
"""
    if args.write:
        write_section("po-catalog", body)
    print(body)


if __name__ == "__main__":
    main()
