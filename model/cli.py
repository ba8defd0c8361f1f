"""The model's subcommands of ``attnserve`` (they need the ``train`` extra: torch, onnx, transformers).

``service/cli/main.py`` hands these over by name, so a service-only install never imports this package.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

COMMANDS = ("train", "average", "evaluate", "export", "import-marian", "import-argos", "export-marian", "calibrate")
CACHE = Path.home() / ".cache" / "attnserve"


def build_parser() -> argparse.ArgumentParser:  # long: one declaration per subcommand, read as a list
    parser = argparse.ArgumentParser(prog="attnserve", description="attnserve model tools (build time)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train or resume a model on a corpus built by `python -m model.corpus`")
    p.add_argument("--corpus", type=Path, default=CACHE / "corpus" / "en-ja", help="corpus directory")
    p.add_argument("--run", type=Path, default=CACHE / "runs" / "en-ja", help="checkpoint directory (resumed)")
    p.add_argument("--name", default="en-ja", help="bundle name recorded in checkpoints")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=6000, help="tokens per batch, padding included")
    p.add_argument("--warmup", type=int, default=1500)
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (CPU with AVX-512-BF16, or CUDA)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: all cores)")
    p.add_argument("--keep-epochs", type=int, default=5, help="keep the weights of the last N epochs (run/epochs/)")
    p.add_argument(
        "--plateau-epochs", type=int, default=0, help="stop once dev chrF gained at most --plateau-gain in N epochs"
    )
    p.add_argument("--plateau-gain", type=float, default=0.3, help="chrF points (with --plateau-epochs)")

    p = sub.add_parser("average", help="average the weights of checkpoints (e.g. the last epochs') for export")
    p.add_argument("checkpoints", type=Path, nargs="+")
    p.add_argument("--out", type=Path, required=True, help="the averaged checkpoint")

    p = sub.add_parser("export", help="write a bundle from a training checkpoint, or a bundle again from its weights")
    p.add_argument("source", type=Path, help="a checkpoint of `attnserve train`, or a bundle directory")
    p.add_argument("out_dir", type=Path, help="the bundle to write (SOURCE itself with --force: re-stored in place)")
    p.add_argument("--force", action="store_true", help="replace an existing bundle")
    p.add_argument("--store", choices=["auto", "float32", "float16"], default="auto",
                   help="the weights' stored dtype (auto: float32 for a checkpoint, a bundle's own); computation "
                   "stays float32")  # fmt: skip
    p.add_argument("--int8", action="store_true", help="also write int8 (dynamically quantized) graphs")
    p.add_argument("--float16", action="store_true", help="also write float16 graphs (for GPUs)")

    p = sub.add_parser("evaluate", help="chrF and BLEU of a bundle on the test split, and the TM baseline")
    p.add_argument("bundle", type=Path)
    p.add_argument("--corpus", type=Path, default=CACHE / "corpus" / "en-ja")
    p.add_argument("--limit", type=int, default=None, help="first N pairs only")
    p.add_argument("--split", choices=["test", "dev"], default="test", help="dev: for choosing a checkpoint")
    p.add_argument("--write", action="store_true", help="record the scores in the bundle's manifest")

    p = sub.add_parser("import-marian", help="convert a Hugging Face MarianMTModel directory into a bundle")
    p.add_argument("hf_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--name", default=None, help="bundle name (default: OUT_DIR's name)")
    p.add_argument("--source-lang", default=None, help="served source code (default: mapped from the model's)")
    p.add_argument("--target-lang", default=None, help="served target code (default: mapped from the model's)")
    p.add_argument("--targets", default=None, help="a multi-target model's served targets, comma-separated")
    p.add_argument("--store", choices=["auto", "float32", "float16"], default="auto",
                   help="the weights' stored dtype (auto: the checkpoint's); computation stays float32")  # fmt: skip
    p.add_argument("--no-check", action="store_true", help="skip comparing greedy output with transformers'")
    p.add_argument("--force", action="store_true")

    p = sub.add_parser("import-argos", help="convert an Argos Translate package (.argosmodel or folder) into a bundle")
    p.add_argument("package", type=Path, nargs="?", help="an .argosmodel zip or an unpacked package folder")
    p.add_argument("out_dir", type=Path, nargs="?")
    p.add_argument("--packages", type=Path, default=None,
                   help="instead: every package folder of this directory, into --cache (docs/DEPLOY.md)")  # fmt: skip
    p.add_argument("--cache", type=Path, default=None, help="with --packages (default: ATTNSERVE_ARGOS_CACHE's)")
    p.add_argument("--name", default=None, help="bundle name (default: OUT_DIR's name)")
    p.add_argument("--force", action="store_true")

    p = sub.add_parser("export-marian", help="write a bundle as a MarianMTModel directory (transformers, CTranslate2)")
    p.add_argument("bundle", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--force", action="store_true")

    p = sub.add_parser("calibrate", help="fit return_details' confidence and flags on the dev split (manifest)")
    p.add_argument("bundle", type=Path)
    p.add_argument("--corpus", type=Path, default=CACHE / "corpus" / "en-ja")
    p.add_argument("--layers", type=int, nargs="+", default=[-1], help="decoder layers giving the coverage")
    p.add_argument("--limit", type=int, default=None, help="first N dev pairs only")
    p.add_argument("--dry-run", action="store_true", help="print the fit without writing the manifest")
    return parser


def export(args: argparse.Namespace) -> Path:
    """``attnserve export``: a checkpoint or a bundle (its variants kept) to a bundle, with the variants asked for."""
    from model.export.bundle import export_checkpoint
    from model.export.quantize import ADD_VARIANT
    from model.export.reexport import export_from_bundle

    float16 = None if args.store == "auto" else args.store == "float16"
    if args.source.is_dir():
        bundle = export_from_bundle(args.source, args.out_dir, float16=float16, force=args.force)
    else:
        bundle = export_checkpoint(args.source, args.out_dir, force=args.force, float16=bool(float16))
    have = json.loads((bundle / "manifest.json").read_text())["graphs"]
    for variant in ("int8", "float16"):
        if getattr(args, variant) and variant not in have:
            ADD_VARIANT[variant](bundle)
    return bundle


def main(argv: list[str]) -> int:  # long: one branch per subcommand, each importing only what it runs
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "train":
            from model.train import TrainConfig, train

            t = TrainConfig(
                epochs=args.epochs,
                max_tokens=args.max_tokens,
                warmup=args.warmup,
                bf16=args.bf16,
                keep_epochs=args.keep_epochs,
                plateau_epochs=args.plateau_epochs,
                plateau_gain=args.plateau_gain,
            )
            print(train(args.corpus, args.run, name=args.name, t=t, threads=args.threads))
        elif args.command == "average":
            from model.train import average_checkpoints

            print(average_checkpoints(args.checkpoints, args.out))
        elif args.command == "export":
            print(export(args))
        elif args.command == "evaluate":
            from model.evaluate import evaluate

            evaluate(args.bundle, args.corpus, limit=args.limit, write=args.write, split=args.split)
        elif args.command == "import-marian":
            from model.importers.marian import import_marian

            targets = args.targets.split(",") if args.targets else None
            print(
                import_marian(
                    args.hf_dir,
                    args.out_dir,
                    name=args.name,
                    source_lang=args.source_lang,
                    target_lang=args.target_lang,
                    targets=targets,
                    store=args.store,
                    check=not args.no_check,
                    force=args.force,
                )
            )
        elif args.command == "import-argos":
            return import_argos_command(args)
        elif args.command == "export-marian":
            from model.importers.marian import export_marian

            print(export_marian(args.bundle, args.out_dir, force=args.force))
        elif args.command == "calibrate":
            from model.calibrate import calibrate

            fitted = calibrate(args.bundle, args.corpus, layers=args.layers, limit=args.limit, write=not args.dry_run)
            print(json.dumps({k: v for k, v in fitted.items() if k != "curve"}, indent=2))
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        logging.getLogger("attnserve").error("%s", e)
        return 2
    return 0


def import_argos_command(args: argparse.Namespace) -> int:
    """``import-argos PACKAGE OUT``, or ``import-argos --packages DIR [--cache CACHE]``: every package of DIR with
    a bundle in CACHE (0 even when some are skipped: the server serves the others)."""
    if args.packages is None:
        if args.package is None or args.out_dir is None:
            raise ValueError("import-argos: give PACKAGE OUT, or --packages DIR [--cache CACHE]")
        from model.importers.argos import import_argos

        print(import_argos(args.package, args.out_dir, name=args.name, force=args.force))
        return 0
    if args.package is not None or args.name is not None:
        raise ValueError("import-argos: --packages takes no PACKAGE, OUT or --name")
    from model.importers.argos_cache import import_packages
    from service.serving.packages import default_cache_dir

    import_packages(args.packages, args.cache or cache_setting() or default_cache_dir())
    return 0


def cache_setting() -> Path | None:
    """ATTNSERVE_ARGOS_CACHE, when set (the server reads the same variable)."""
    value = os.environ.get("ATTNSERVE_ARGOS_CACHE")
    return Path(value) if value else None
