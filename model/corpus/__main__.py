"""``python -m model.corpus build --pair en-ja [--download] [--no-spm]``."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

from model import corpus
from model.corpus.build import build, parse_pair
from model.corpus.cleaning import CJK_LANGS
from model.corpus.fetching import download_debs, find_debs, read_package_list

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PACKAGES = "../shared/data/gettext-packages.txt"  # relative to the repository root
DEFAULT_DEBS_DIR = "~/.cache/attnserve/debs"
DEFAULT_CORPUS_DIR = "~/.cache/attnserve/corpus"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(prog="python -m model.corpus", description=(corpus.__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="build train/dev/test TSVs (and a SentencePiece model)")
    build_parser.add_argument("--pair", required=True, help="language pair, e.g. en-ja or en-de")
    build_parser.add_argument("--debs-dir", type=Path, default=Path(DEFAULT_DEBS_DIR), help="cache of .deb files")
    build_parser.add_argument("--out", type=Path, help=f"output directory (default {DEFAULT_CORPUS_DIR}/<pair>)")
    build_parser.add_argument("--download", action="store_true", help="apt-get download the missing .debs first")
    build_parser.add_argument(
        "--packages", type=Path, default=Path(DEFAULT_PACKAGES), help="package list (relative to the repository root)"
    )
    build_parser.add_argument("--no-spm", action="store_true", help="do not train the SentencePiece model")
    build_parser.add_argument("--vocab-size", type=int, default=8000, help="SentencePiece vocabulary size")
    build_parser.add_argument("--spm-threads", type=int, default=2, help="SentencePiece training threads")
    build_parser.add_argument(
        "--character-coverage",
        type=float,
        help="SentencePiece character coverage (default 0.9995 for a CJK target language, else 1.0)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m model.corpus build --pair en-ja [--download] [--no-spm]``."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    debs_dir = args.debs_dir.expanduser()
    out_dir = (args.out or Path(DEFAULT_CORPUS_DIR) / args.pair).expanduser()
    if args.download:
        packages_file = args.packages if args.packages.is_absolute() else REPO_ROOT / args.packages
        download_debs(read_package_list(packages_file), debs_dir)

    from tqdm import tqdm

    started = time.monotonic()
    command = shlex.join(["python", "-m", "model.corpus", *(sys.argv[1:] if argv is None else argv)])
    with tqdm(total=len(find_debs(debs_dir)), unit="deb", desc=f"reading {args.pair}") as bar:
        summary = build(args.pair, debs_dir, out_dir, command=command, on_deb=lambda _: bar.update())
    print(f"corpus: {json.dumps(summary['counts'])}, dropped {json.dumps(summary['dropped'])}")
    print(f"corpus built in {time.monotonic() - started:.0f} s: {out_dir}")

    if not args.no_spm:
        from model.tokenizer import train_corpus_tokenizer

        spm_started = time.monotonic()
        coverage = args.character_coverage or (0.9995 if parse_pair(args.pair)[1] in CJK_LANGS else 1.0)
        stats = train_corpus_tokenizer(
            out_dir, vocab_size=args.vocab_size, num_threads=args.spm_threads, character_coverage=coverage
        )
        summary["spm"] = stats
        (out_dir / "summary.json").write_text(
            json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )
        print(f"spm trained in {time.monotonic() - spm_started:.0f} s: {json.dumps(stats)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
