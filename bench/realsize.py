"""attnserve against CTranslate2 (and LibreTranslate) on models of the sizes people serve, made here (never
downloaded) and cached under ~/.cache/attnserve/bench/realsize/:

- **trained, 58 k**: model/bundles/en-ja's weights with the vocabulary grown to 58,000 pieces (filler rows drawn with
  the trained rows' spread, column by column; the tokenizer never makes their pieces), written as an OPUS-MT
  directory, imported with ``attnserve import-marian`` and given int8 graphs by ``attnserve derive``; CTranslate2
  converts the same directory (``TransformersConverter``).
- **flat, 74 M**: the OPUS-MT transformer-base shape (d 512, 6+6 layers, 8 heads, FFN 2048, 58,000 pieces) with
  random weights (tests/numpy_models.py ``marian_directory``), its logits flat, so its outputs run to ``max_length``;
  imported and derived the same way.
- **Argos int8, 74 M**: an OpenNMT-py checkpoint of that size converted by CTranslate2's own ``OpenNMTPyConverter``
  with ``quantization="int8"`` (tests/model/importers/argos_packages.py ``onmt_package``), zipped as an
  ``.argosmodel`` and imported with ``attnserve import-argos``; CTranslate2 runs the package's own model.

For each model, thread count (1, 2) and compute type (float32, int8), side by side: CTranslate2's
``translate_batch`` and attnserve's runner alone, each a process of bench/peers.py ``--engine`` (batches of 32
sorted by length, greedy and beam 4), then ``attnserve serve`` under 32 closed-loop clients sending one text a
request (bench/overhead.py's load) at each decoding. The ratio over HTTP is against CTranslate2 called directly
("raw", as bench/overhead.py compares), from the run just before. Servers and engines run pinned to core 0 (one
thread) or cores 0-1 (two), the load generator to core 1. Every cell says whether both sides produced the same
tokens (offline) or the same text (over HTTP, the texts without protected spans).

``--profile MODEL,COMPUTE,BEAM,THREADS`` profiles one cell's server under that load instead (py-spy and perf,
bench/profile_table.py, as ``bench/overhead.py --profile``) into a section of its own
(``realsize-profile-MODEL-COMPUTE-BEAM-THREADS``).

``--libretranslate VENV`` adds bench/libretranslate.py on the Argos package: LibreTranslate 1.9.6 against attnserve
serving the same installed package from ``ATTNSERVE_ARGOS_PACKAGES``.

    python bench/realsize.py --libretranslate /tmp/lt-venv-reload
    python bench/realsize.py --models trained --threads 1 --sentences 16 --seconds 2 --no-write
    python bench/realsize.py --profile flat,float32,4,1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from common import CORPUS, DOCS, ROOT, Server, machine, pairs, versions, write_section
from offline import Job, run_job
from overhead import CLIENT_CORE, attnserve_server, closed_loop, plain_texts

from service.runtime.bundle import FORMAT

sys.path.insert(0, str(ROOT))  # tests/ (the models' builders)

CACHE = Path.home() / ".cache" / "attnserve" / "bench" / "realsize"
SPM = ROOT / "model" / "bundles" / "en-ja" / "spm.model"
MODELS = ("trained", "flat", "argos")
LABELS = {"trained": "trained, 58 k", "flat": "flat, 74 M", "argos": "Argos int8, 74 M"}
CORES = {1: "0", 2: "0,1"}
ATTNSERVE = [str(Path(sys.executable).with_name("attnserve"))]
# each text decoded whole and as decoded, no model outside --bundle: the work CTranslate2 does
SERVE_ENV = {"ATTNSERVE_SENTENCE_SPLIT_CHARS": "100000", "ATTNSERVE_REPETITION_GUARD": "false",
             "ATTNSERVE_ARGOS_PACKAGES": "", "ATTNSERVE_REQUEST_TIMEOUT_S": "600"}  # fmt: skip
TIMEOUT = 600  # a client's, s: a 74 M model's 32 queued texts of 48 tokens take minutes on a busy core


@dataclass(frozen=True)
class Size:
    """A model's shape: OPUS-MT's transformer-base by default."""

    vocab: int = 58_000
    d_model: int = 512
    heads: int = 8
    d_ff: int = 2048
    layers: int = 6

    def stamp(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


@dataclass(frozen=True)
class Model:
    """A built model: the attnserve bundle, CTranslate2's model directory, the vocabulary both index (vocab.json:
    piece -> the bundle's id) and, for the Argos package, its unpacked folder and .argosmodel."""

    name: str
    bundle: Path
    ct2: Path
    vocab: Path
    package: Path | None = None
    archive: Path | None = None


def attnserve(*args: str) -> None:
    subprocess.run([*ATTNSERVE, *args], check=True, cwd=ROOT)


def grow_vocabulary(hf: Path, size: int, seed: int = 0) -> None:
    """A MarianMTModel directory's vocabulary grown to ``size`` pieces in place: filler pieces before ``<pad>`` (kept
    last), their embedding rows drawn per column from the trained rows' mean and standard deviation, their final
    logits bias likewise."""
    from safetensors.numpy import load_file, save_file

    vocab: dict[str, int] = json.loads((hf / "vocab.json").read_text())
    pad = vocab.pop("<pad>")
    assert pad == len(vocab), "opus-mt's layout: <pad> last"
    vocab |= {f"▁filler{i}": pad + i for i in range(size - pad - 1)}
    vocab["<pad>"] = size - 1
    tensors = load_file(str(hf / "model.safetensors"))
    rng = np.random.default_rng(seed)
    n = size - pad - 1
    shared = tensors["model.shared.weight"][:pad]  # (pieces, d_model); tied: the output rows too
    filler = rng.normal(shared.mean(0), shared.std(0), (n, shared.shape[1])).astype(np.float32)
    tensors["model.shared.weight"] = np.concatenate([shared, filler, np.zeros_like(shared[:1])])  # pad row zero
    bias = tensors["final_logits_bias"][0, :pad]
    filler_bias = rng.normal(bias.mean(), bias.std(), n).astype(np.float32)
    tensors["final_logits_bias"] = np.concatenate([bias, filler_bias, [0]]).astype(np.float32)[None]
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(hf / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    (hf / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    config = json.loads((hf / "config.json").read_text())
    ids = {"vocab_size": size, "decoder_vocab_size": size, "pad_token_id": size - 1, "decoder_start_token_id": size - 1}
    (hf / "config.json").write_text(json.dumps(config | ids, indent=2))
    (hf / "generation_config.json").unlink(missing_ok=True)  # its token ids were the old vocabulary's


def marian_model(name: str, hf: Path, out: Path) -> Model:
    """``attnserve import-marian`` of a MarianMTModel directory, ``attnserve derive`` of its int8 graphs, and
    CTranslate2's conversion of the same directory."""
    import ctranslate2

    attnserve("import-marian", str(hf), str(out / "bundle"), "--source-lang", "en", "--target-lang", "ja", "--force")
    attnserve("derive", str(out / "bundle"))
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out / "ct2"), force=True)
    shutil.copyfile(hf / "vocab.json", out / "vocab.json")  # the bundle's ids: Marian's
    return Model(name, out / "bundle", out / "ct2", out / "vocab.json")


def trained(out: Path, size: Size, base: Path) -> Model:
    from model.importers.marian import export_marian

    hf = export_marian(base, out / "marian", force=True)
    grow_vocabulary(hf, size.vocab)
    return marian_model("trained", hf, out)


def flat(out: Path, size: Size, spm: Path) -> Model:
    from tests.numpy_models import marian_directory

    shutil.rmtree(out / "marian", ignore_errors=True)
    hf = marian_directory(out / "marian", spm, d_model=size.d_model, heads=size.heads, d_ff=size.d_ff,
                          layers=(size.layers, size.layers), vocab_size=size.vocab, positions=512)  # fmt: skip
    return marian_model("flat", hf, out)


def argos(out: Path, size: Size, spm: Path) -> Model:
    from service.runtime.bundle import load_bundle
    from tests.model.importers.argos_packages import onmt_package, zip_package

    shutil.rmtree(out / "onmt", ignore_errors=True)
    (out / "onmt").mkdir(parents=True)
    built = onmt_package(out / "onmt", spm, "int8", {}, d=size.d_model, heads=size.heads, d_ff=size.d_ff,
                         layers=size.layers, positions=512, vocab_size=size.vocab)  # fmt: skip
    folder = out / "translate-en_ja"
    shutil.rmtree(folder, ignore_errors=True)
    built.rename(folder)
    meta = json.loads((folder / "metadata.json").read_text())
    meta |= {"argos_version": "1.0", "from_name": "English", "to_name": "Japanese", "links": []}
    (folder / "metadata.json").write_text(json.dumps(meta))  # what argos-translate's index lists
    archive = zip_package(folder, out / "translate-en_ja.argosmodel")
    attnserve("import-argos", str(archive), str(out / "bundle"), "--force")
    tokenizer = load_bundle(out / "bundle", verify=False).tokenizer
    vocab = {p: i for i, p in tokenizer.pieces_by_id.items()}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return Model("argos", out / "bundle", folder / "model", out / "vocab.json", folder, archive)


BUILDERS = {"flat": flat, "argos": argos}


def build(name: str, cache: Path, size: Size, base: Path, spm: Path) -> Model:
    """Model ``name`` under ``cache``, built unless it already is at this size and bundle format."""
    out = cache / name
    stamp = f"{size.stamp()} {base.resolve() if name == 'trained' else spm.resolve()} {FORMAT}"
    ready = out / "ready.json"
    if ready.exists() and json.loads(ready.read_text())["stamp"] == stamp:
        entry = json.loads(ready.read_text())["model"]
        return Model(entry["name"], *(Path(entry[k]) for k in ("bundle", "ct2", "vocab")),
                     *(Path(entry[k]) if entry[k] else None for k in ("package", "archive")))  # fmt: skip
    print(f"building {LABELS[name]} in {out}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    model = trained(out, size, base) if name == "trained" else BUILDERS[name](out, size, spm)
    entry = {k: str(v) if isinstance(v, Path) else v for k, v in model.__dict__.items()}
    ready.write_text(json.dumps({"stamp": stamp, "model": entry}))
    return model


# ---------------------------------------------------------------------------------------------------------------
# The cells: one model, compute type, decoding and thread count, offline and over HTTP.


@dataclass
class Cell:
    model: str
    compute: str
    beam: int
    threads: int
    ct2: dict[str, Any] = field(default_factory=dict)  # bench/offline.py's run_job result
    ours: dict[str, Any] = field(default_factory=dict)
    http: tuple[float, float] = (0.0, 0.0)  # sentences/s, median latency (s)
    http_same: tuple[int, int, int] = (0, 0, 0)  # texts equal to CTranslate2's, to the runner's, texts compared

    @property
    def decoding(self) -> str:
        return "greedy" if self.beam == 1 else f"beam {self.beam}"

    def rate(self, side: dict[str, Any], unit: str) -> float:
        """Target tokens/s or sentences/s of an offline run."""
        n = sum(len(t) for t in side["tokens"]) if unit == "tokens" else len(side["tokens"])
        return float(n / side["seconds"])

    def same_tokens(self) -> str:
        a, b = self.ct2["tokens"], self.ours["tokens"]
        same = sum(x == y for x, y in zip(a, b, strict=True))
        return f"{same}/{len(a)} ({sum(map(len, b)):,} / {sum(map(len, a)):,} tokens)"


@contextmanager
def on_cores(cores: str) -> Iterator[None]:
    """This process (and what it starts meanwhile) on ``cores``, then back where it was."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def set_up(model: Model, sentences: list[str], work: Path, max_length: int) -> Path:
    """bench/peers.py ``--engine``'s setup.json for ``model`` (its bundle's token ids of ``sentences``)."""
    from service.runtime.bundle import load_bundle

    tokenizer = load_bundle(model.bundle, verify=False).tokenizer
    setup = {"bundle": str(model.bundle), "hf": str(model.ct2.parent / "marian"), "ct2": str(model.ct2),
             "vocab": str(model.vocab), "sources": [tokenizer.encode_source(s) for s in sentences],
             "max_length": max_length}  # fmt: skip
    (work / model.name).mkdir(parents=True, exist_ok=True)
    (work / model.name / "setup.json").write_text(json.dumps(setup))
    return work / model.name


def offline(cell: Cell, engine: str, work: Path) -> dict[str, Any]:
    """One offline run of ``engine`` (``ctranslate2``, ``attnserve``) on the cell's cores."""
    with on_cores(CORES[cell.threads]):
        return run_job(Job(engine, cell.compute, cell.beam, cell.threads), work, timeout=600)


def server_env(compute: str, threads: int) -> dict[str, str]:
    """The server's settings: ``compute``'s graphs, one decoding thread of ``threads`` intra-op threads."""
    return {**SERVE_ENV, "ATTNSERVE_GRAPH_VARIANT": compute, "ATTNSERVE_THREADS": str(threads),
            "ATTNSERVE_DECODE_THREADS": "1", "OMP_NUM_THREADS": str(threads)}  # fmt: skip


def bodies(sentences: list[str], beam: int, max_length: int) -> list[dict[str, Any]]:
    return [{"q": s, "source": "en", "target": "ja", "beam_size": beam, "max_length": max_length} for s in sentences]


def serve(model: Model, compute: str, threads: int) -> Server:
    """``attnserve serve`` of ``model`` at the cell's compute type and threads, on the cell's cores."""
    return attnserve_server(model.bundle, server_env(compute, threads), ATTNSERVE, CORES[threads], ready_timeout=300)


def http(model: Model, cells: list[Cell], sentences: list[str], args: argparse.Namespace) -> None:
    """One server of the cells' model, compute type and threads; each cell's decoding under the closed loop, and its
    first answers compared with both offline runs' (detokenized) on the texts without protected spans."""
    from service.runtime.bundle import load_bundle

    tokenizer = load_bundle(model.bundle, verify=False).tokenizer
    plain = [i for i, p in enumerate(plain_texts(model.bundle, sentences)) if p]
    first = cells[0]
    with serve(model, first.compute, first.threads) as server:
        for cell in cells:
            load = bodies(sentences, cell.beam, args.max_length)
            asyncio.run(closed_loop(server.url, load, args.clients, min(2.0, args.seconds), TIMEOUT))  # warm-up
            rate, p50, outputs = asyncio.run(closed_loop(server.url, load, args.clients, args.seconds, TIMEOUT))
            cell.http = (rate, p50)
            ct2, ours = ([tokenizer.decode(t) for t in side["tokens"]] for side in (cell.ct2, cell.ours))
            answered = [i for i in plain if i in outputs]
            cell.http_same = (sum(outputs[i] == ct2[i] for i in answered), sum(outputs[i] == ours[i] for i in answered),
                              len(answered))  # fmt: skip


def profile(model: Model, cell: Cell, sentences: list[str], args: argparse.Namespace, command: str) -> str:
    """One cell's server under its closed loop, profiled (bench/profile_table.py); returns its section."""
    from profile_table import profile_section, record_profile

    load = bodies(sentences, cell.beam, args.max_length)
    with serve(model, cell.compute, cell.threads) as server:
        asyncio.run(closed_loop(server.url, load, args.clients, min(2.0, args.seconds), TIMEOUT))  # warm-up
        run = partial(closed_loop, server.url, load, args.clients, args.seconds, TIMEOUT)
        recorded = record_profile(server, lambda: asyncio.run(run()))
    what = f"the server of {LABELS[model.name]}, {cell.compute}, {cell.decoding}, {cell.threads} thread(s)"
    section = profile_section(recorded, "realsize", command, what)
    return section.replace("bench/overhead.py --profile", "bench/realsize.py")


def run_cells(model: Model, sentences: list[str], work: Path, args: argparse.Namespace) -> list[Cell]:
    """Every cell of ``model``, in groups of one server (threads, compute type), each printed when done."""
    work = set_up(model, sentences, work, args.max_length)
    cells = []
    for threads in args.threads:
        for compute in args.computes:
            group = [Cell(model.name, compute, beam, threads) for beam in args.beams]
            for cell in group:
                cell.ct2 = offline(cell, "ctranslate2", work)
                cell.ours = offline(cell, "attnserve", work)
            http(model, group, sentences, args)
            for cell in group:
                print(f"  {LABELS[model.name]}, {compute}, {cell.decoding}, {threads} thread(s): runner "
                      f"{cell.rate(cell.ours, 'tokens'):,.0f} / CTranslate2 {cell.rate(cell.ct2, 'tokens'):,.0f} "
                      f"tokens/s, same tokens {cell.same_tokens()}; HTTP {cell.http[0]:.1f} / raw "
                      f"{cell.rate(cell.ct2, 'sentences'):.1f} sentences/s, same text {cell.http_same[0]}/"
                      f"{cell.http_same[2]} (runner's {cell.http_same[1]})", flush=True)  # fmt: skip
            cells += group
    return cells


# ---------------------------------------------------------------------------------------------------------------
# The report.


def tables(cells: list[Cell]) -> tuple[str, str]:
    """The offline table (target tokens/s) and the HTTP table (sentences/s), a row a cell."""
    offline_rows = ["| model | compute | decoding | threads | attnserve runner | CTranslate2 | ratio | same tokens "
                    "(sequences; target tokens attnserve / CTranslate2) |",
                    "|---|---|---|---|---:|---:|---:|---|"]  # fmt: skip
    http_rows = ["| model | compute | decoding | threads | attnserve over HTTP | CTranslate2 raw | ratio | p50 ms | "
                 "same text as CTranslate2 / as the runner |", "|---|---|---|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for c in cells:
        key = f"| {LABELS[c.model]} | {c.compute} | {c.decoding} | {c.threads} |"
        ours, theirs = c.rate(c.ours, "tokens"), c.rate(c.ct2, "tokens")
        offline_rows.append(f"{key} {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}× | {c.same_tokens()} |")
        raw = c.rate(c.ct2, "sentences")
        same_ct2, same_ours, n = c.http_same
        http_rows.append(f"{key} {c.http[0]:.1f} | {raw:.1f} | {c.http[0] / raw:.2f}× | {c.http[1] * 1000:.0f} | "
                         f"{same_ct2}/{n} / {same_ours}/{n} |")  # fmt: skip
    return "\n".join(offline_rows), "\n".join(http_rows)


def filler_chosen(model: Model, cells: list[Cell]) -> int:
    """How many filler pieces the trained model's outputs hold, over every run."""
    vocab: dict[str, int] = json.loads(model.vocab.read_text())
    filler = {i for p, i in vocab.items() if p.startswith("▁filler")}
    runs = [side["tokens"] for c in cells if c.model == model.name for side in (c.ct2, c.ours)]
    return sum(t in filler for tokens in runs for row in tokens for t in row)


def section(args: argparse.Namespace, command: str, models: list[Model], cells: list[Cell], lt: str,
            load: tuple[float, float]) -> str:  # fmt: skip
    offline_table, http_table = tables(cells)
    trained_note = "".join(f" The trained model's outputs held {filler_chosen(m, cells)} filler pieces over every run."
                           for m in models if m.name == "trained")  # fmt: skip
    lt_part = lt.replace("\n## ", "\n### ").replace("## ", "### ", 1) if lt else ""
    return f"""## Real-size models (bench/realsize.py)

`{command}`

{machine()}; {versions("onnxruntime", "ctranslate2", "uvicorn")}. Shared with other work: load average (1 min)
{load[0]:.1f} before, {load[1]:.1f} after, on 2 cores, so single figures are noisy; each ratio compares runs made
minutes apart in one run. Models made by the bench (never downloaded): **trained, 58 k**: model/bundles/en-ja
(d 256, 3+3 layers) with its vocabulary grown from 8,000 to 58,000 pieces, filler rows drawn with the trained rows'
mean and spread per column, `attnserve import-marian` then `attnserve derive`; **flat, 74 M**: OPUS-MT's
transformer-base shape (d 512, 6+6 layers, 8 heads, FFN 2048, 58,000 pieces) with random weights, imported the
same way; **Argos int8, 74 M**: an OpenNMT-py checkpoint of that shape converted by CTranslate2's
`OpenNMTPyConverter` with `quantization="int8"`, imported with `attnserve import-argos` (its float32 graphs hold
the dequantized int8 weights, as CTranslate2 at `compute_type="float32"` does). CTranslate2 runs the same weights
(the Marian directories through `TransformersConverter`, the package's own model).{trained_note}

{len(args.sentences_used)} test sentences (the en-ja test split, a deterministic sample), one `max_length`
({args.max_length}) everywhere, beam search with length penalty 1. Offline: each run a process of its own
(bench/peers.py `--engine`), batches of 32 sorted by length, on core 0 (one thread) or cores 0-1 (two: CTranslate2
`intra_threads`, attnserve's ONNX Runtime intra-op threads); target tokens/s. Over HTTP: `attnserve serve` pinned
the same way (`ATTNSERVE_THREADS`, one decoding thread, the compute type's graphs, each text decoded whole and as
decoded: `ATTNSERVE_REPETITION_GUARD=false`), {args.clients} closed-loop clients on core 1 sending one text a
request, {args.seconds:g} s after a warm-up; against CTranslate2 called directly, its offline run's sentences/s
("raw", as bench/overhead.py compares). Same text: the first answer to each text without protected spans, against
the offline runs' tokens detokenized.

### Offline: attnserve's runner and CTranslate2 (target tokens/s)

{offline_table}

### Over HTTP: attnserve serve against CTranslate2 raw (sentences/s)

{http_table}

{lt_part}
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--threads", type=int, nargs="+", choices=sorted(CORES), default=[1, 2])
    ap.add_argument("--computes", nargs="+", choices=["float32", "int8"], default=["float32", "int8"])
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes (1 = greedy)")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV: source, reference (default: the test split)")
    ap.add_argument("--sentences", type=int, default=48, help="test sentences (a deterministic sample)")
    ap.add_argument("--max-length", type=int, default=48, help="every engine's max_length")
    ap.add_argument("--clients", type=int, default=32, help="closed-loop clients over HTTP")
    ap.add_argument("--seconds", type=float, default=8, help="seconds of load a cell over HTTP")
    ap.add_argument("--trained-bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--spm", type=Path, default=SPM, help="the random models' SentencePiece model")
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the models are built once")
    ap.add_argument("--profile", metavar="MODEL,COMPUTE,BEAM,THREADS", help="profile this cell's server only")
    ap.add_argument("--libretranslate", type=Path, metavar="VENV", help="also bench/libretranslate.py on the package")
    ap.add_argument("--lt-sentences", type=int, default=16, help="test sentences of the LibreTranslate part")
    ap.add_argument("--lt-seconds", type=float, default=5, help="seconds of load a LibreTranslate cell")
    ap.add_argument("--work", type=Path, default=None, help="scratch files here (default: a temporary directory)")
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md goes here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    return ap.parse_args(argv)


def libretranslate(args: argparse.Namespace, package: Model, work: Path) -> str:
    """bench/libretranslate.py on the Argos package, attnserve serving it from ``ATTNSERVE_ARGOS_PACKAGES`` at
    LibreTranslate's decoding length (its CTranslate2 decodes up to 256 tokens; the random model's outputs run
    that long)."""
    import libretranslate as lt

    assert package.archive is not None
    argv = ["--lt-venv", str(args.libretranslate), "--package", str(package.archive), "--argos-packages",
            "--max-length", "256", "--set", "ATTNSERVE_REPETITION_GUARD=false", "--set",
            f"ATTNSERVE_REQUEST_TIMEOUT_S={TIMEOUT}", "--sentences", str(args.lt_sentences),
            "--seconds", f"{args.lt_seconds:g}", "--texts", str(args.texts), "--work", str(work / "lt")]  # fmt: skip
    return lt.compare(lt.parse_args(argv))


def main(argv: Sequence[str] | None = None) -> None:
    import tempfile

    args = parse_args(argv)
    os.sched_setaffinity(0, {int(CLIENT_CORE)})  # the load generator; servers and engines: on_cores
    load_before = os.getloadavg()[0]
    args.sentences_used = [s for s, _ in pairs(args.texts, args.sentences) if s.strip()]
    words = argv if argv is not None else sys.argv[1:]
    command = "python bench/realsize.py " + " ".join(shlex.quote(a) for a in words)
    if args.profile:
        name, compute, beam, threads = args.profile.split(",")
        model = build(name, args.cache, Size(), args.trained_bundle, args.spm)
        body = profile(model, Cell(name, compute, int(beam), int(threads)), args.sentences_used, args, command)
        print(body, flush=True)
        if not args.no_write:
            write_section(f"realsize-profile-{args.profile.replace(',', '-')}", body, args.out / "BENCHMARKS.md")
        return
    models = [build(name, args.cache, Size(), args.trained_bundle, args.spm) for name in args.models]
    work = args.work or Path(tempfile.mkdtemp(prefix="realsize-"))
    try:
        cells = []
        for model in models:
            print(f"{LABELS[model.name]}:", flush=True)
            cells += run_cells(model, args.sentences_used, work, args)
        body = section(args, command, models, cells, "", (load_before, os.getloadavg()[0]))
        if not args.no_write:  # kept should the LibreTranslate part fail
            write_section("realsize", body, args.out / "BENCHMARKS.md")
        package = next((m for m in models if m.archive is not None), None)
        if args.libretranslate and package:
            lt = libretranslate(args, package, work)
            body = section(args, command, models, cells, lt, (load_before, os.getloadavg()[0]))
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + body, flush=True)
    if not args.no_write:
        write_section("realsize", body, args.out / "BENCHMARKS.md")


if __name__ == "__main__":
    main()
