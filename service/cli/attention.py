"""``attnserve attention``: a text's attention weights, here without a server: a summary, or /attention's JSON answer
(``--json``); a file of texts (``--file``, ``-`` for stdin, one a line) to JSON Lines, one answer a line in the
file's order, decoded ``--batch-size`` texts together, with a progress bar on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from service.serving.engine import Engine
    from service.serving.translation import AttentionResult, Filters, Options

KINDS = ("encoder", "decoder", "cross")
T = TypeVar("T")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "attention",
        help="attention weights of a text, or of a file of texts to JSON Lines",
        description="A text's translation with its attention weights, as POST /attention answers it: a summary (per "
        "layer and head the entropy and each target token's most attended source token), or with --json the "
        "answer itself; with --file, one JSON answer a line for each line of the file.",
    )
    p.add_argument("text", nargs="?", help="the text (or --file)")
    p.add_argument("--file", type=Path, help="a file of texts, one a line ('-': standard input), to JSON Lines")
    p.add_argument("--batch-size", type=_positive, default=32, help="texts of --file decoded together (default 32)")
    p.add_argument(
        "--bundle", type=Path, default=None, help="bundle directory (default: the first bundle serving --target)"
    )
    p.add_argument("--target", default=None, help="target language (default: the first bundle's first)")
    p.add_argument("--beam-size", type=_positive, default=1)
    p.add_argument("--max-length", type=_positive, default=None, help="tokens generated at most")
    p.add_argument("--target-text", default=None, help="force-decode this translation (one text)")
    p.add_argument("--raw", action="store_true", help="the text goes to the model as given (/attention's raw)")
    p.add_argument("--json", action="store_true", help="print /attention's JSON answer")
    p.add_argument("--kinds", type=_kinds, default=list(KINDS), help="e.g. cross,encoder (default all)")
    p.add_argument("--layers", type=_indices, default=None, help="layer indices, e.g. 0,2 (default all)")
    p.add_argument("--heads", type=_indices, default=None, help="head indices, e.g. 0,3 (default all)")


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return n


def _kinds(value: str) -> list[str]:
    kinds = [k.strip() for k in value.split(",")]
    if bad := [k for k in kinds if k not in KINDS]:
        raise argparse.ArgumentTypeError(f"{', '.join(bad)}: the kinds are {', '.join(KINDS)}")
    return kinds


def _indices(value: str) -> list[int]:
    try:
        return [int(i) for i in value.split(",")]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value}: give indices separated by commas, e.g. 0,2") from e


def main(args: argparse.Namespace, engine: Engine) -> int:
    """Run ``attnserve attention`` on ``engine``; 2 (with one line on stderr) for arguments that do not go together.

    Raises:
        ServiceError: as :meth:`Engine.attention_now` (a layer or head that does not exist, a text over a limit).
    """
    from service.serving.translation import Filters, Options

    if (args.text is None) == (args.file is None):
        print("attnserve: attention: give a text or --file, one of them", file=sys.stderr)
        return 2
    if args.file is not None and args.target_text is not None:
        print("attnserve: attention: --target-text forces one text; it does not go with --file", file=sys.stderr)
        return 2
    options = Options(beam_size=args.beam_size, max_length=args.max_length, raw=args.raw)
    filters = Filters(args.kinds, args.layers, args.heads)
    if args.file is None:
        (result,) = engine.attention_now([args.text], options, filters, [args.target_text])
        if args.json:
            sys.stdout.write(json_answer(result) + "\n")
        else:
            print_attention(result)
        return 0
    stdin = str(args.file) == "-"
    with nullcontext(sys.stdin) if stdin else args.file.open(encoding="utf-8", newline="") as lines:
        texts = [line.rstrip("\r\n") for line in lines]
    if empty := [n for n, t in enumerate(texts, 1) if not t.strip()]:
        print(f"attnserve: attention: {args.file}: line {empty[0]} has no text; give one text a line", file=sys.stderr)
        return 2
    write_lines(engine, texts, options, filters, args.batch_size)
    return 0


def write_lines(engine: Engine, texts: list[str], options: Options, filters: Filters, batch_size: int) -> None:
    """Each text's /attention answer as one line of JSON on stdout, in order, ``batch_size`` texts decoded
    together, with a progress bar on stderr (shown on a terminal)."""
    from tqdm import tqdm

    with tqdm(total=len(texts), unit="text", file=sys.stderr, disable=None) as bar:
        for batch in _batches(texts, batch_size):
            for result in engine.attention_now(batch, options, filters):
                sys.stdout.write(json_answer(result) + "\n")
            sys.stdout.flush()
            bar.update(len(batch))


def json_answer(result: AttentionResult) -> str:
    """The answer POST /attention gives (``encoding`` json), as one line."""
    from service.http.routes.attention import render

    return render((result, None), "json", False).decode("utf-8")


def _batches(items: list[T], size: int) -> Iterator[list[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def print_attention(result: AttentionResult) -> None:
    """The translation, then per segment (a line or sentence, as /translate cuts the text) its tokens and, per layer
    and head, the entropy (how spread the weights are) and, for cross-attention, which source token each target
    token attends to most."""
    print(result.text)
    several = len(result.segments) > 1
    for number, segment in enumerate(result.segments, 1):
        src, tgt = segment.source_tokens, segment.target_tokens
        if several:
            print(f"segment {number}: characters {segment.source[0]}-{segment.source[1]}: {segment.model_input}")
        print(f"source: {' '.join(src)}\ntarget: {' '.join(tgt)}")
        for kind, layers in result.layers.items():
            for layer, heads in zip(layers, segment.weights[kind], strict=True):
                for head, a in zip(result.heads, heads, strict=True):
                    entropy = float(-(a * np.log(np.clip(a, 1e-12, 1))).sum(-1).mean())
                    line = f"{kind:7s} L{layer} H{head}  entropy {entropy:5.2f}"
                    if kind == "cross":
                        line += "  " + " ".join(f"{t}→{src[int(j)]}" for t, j in zip(tgt, a.argmax(-1), strict=True))
                    print(line)
