"""attnserve beside LibreTranslate, serving the same Argos package, each alone on one core.

The package is the bundle's own weights as LibreTranslate's users hold theirs: ``attnserve export-marian`` and
CTranslate2's ``TransformersConverter`` (bench/engines.py's :func:`~engines.prepare`), its SentencePiece model, and
config.json's ``add_source_eos`` (the bundle's sources end with ``</s>``), zipped as an ``.argosmodel``. attnserve
serves it through ``attnserve import-argos``; LibreTranslate (its PyPI package in a venv of its own, ``--lt-venv``)
installs it into argos-translate's packages directory and serves it offline (bench/libretranslate_server.py: its
sentence splitter, which downloads a model, replaced by one that keeps each text whole; ``ARGOS_PACKAGE_INDEX`` a
local index listing the installed package only; ``--load-only en,ja``).

``--package`` serves a given ``.argosmodel`` instead (bench/realsize.py's), ``--argos-packages`` has attnserve serve
LibreTranslate's installed packages directory through ``ATTNSERVE_ARGOS_PACKAGES`` (no import step: the server
imports what it lacks into its cache at start-up) rather than a bundle imported with ``import-argos``.

Each server runs pinned to core 0 (``taskset``), the load generator (bench/overhead.py's closed loop) to core 1, in
two shapes: 32 clients sending one sentence a request, and Weblate's (4 clients sending 20 sentences a request); with
two decodings: greedy on one thread (LibreTranslate: ``ARGOS_BEAM_SIZE=1``, one CTranslate2 thread), and
LibreTranslate's defaults (beam 4, its own thread settings; attnserve: ``ATTNSERVE_DEFAULT_BEAM_SIZE=4`` and
``ATTNSERVE_DEFAULT_LENGTH_PENALTY=0.2``, argos-translate's, requests naming neither). Then every sentence is
translated once more by each server and the outputs compared.

    python bench/libretranslate.py --lt-venv /tmp/lt-venv --seconds 15
    python bench/libretranslate.py --lt-venv /tmp/lt-venv --package PKG.argosmodel --argos-packages --max-length 256
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from common import CORPUS, DOCS, ROOT, Server, free_port, pairs, write_section
from engines import prepare
from overhead import CLIENT_CORE, SERVER_CORE, attnserve_server, closed_loop, held_out_sentences, pinned

LT_SERVER = Path(__file__).resolve().with_name("libretranslate_server.py")
SHAPES = {"single text, 32 clients": (32, 1), "Weblate, 4 clients × 20 texts": (4, 20)}
GREEDY, DEFAULTS = "greedy, one thread", "LibreTranslate's defaults (beam 4)"
LT_ENV = {GREEDY: {"ARGOS_BEAM_SIZE": "1", "ARGOS_INTER_THREADS": "1", "ARGOS_INTRA_THREADS": "1"}, DEFAULTS: {}}
# attnserve at LibreTranslate's decoding through its defaults (docs/API.md): requests name none, as Weblate's do.
ATTNSERVE_DECODING = {
    GREEDY: {},
    DEFAULTS: {"ATTNSERVE_DEFAULT_BEAM_SIZE": "4", "ATTNSERVE_DEFAULT_LENGTH_PENALTY": "0.2"},
}
PUNCTUATION = frozenset("!?.,;。")  # libretranslate/language.py's improve_translation_formatting
# attnserve decodes a text whole, as the bench's splitter has LibreTranslate do
ATTNSERVE_ENV = {"ATTNSERVE_SENTENCE_SPLIT_CHARS": "100000"}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--texts", type=Path, default=CORPUS, help="TSV: source, reference (default: the test split)")
    ap.add_argument("--sentences", type=int, default=300, help="held-out sentences (a deterministic sample)")
    ap.add_argument("--seconds", type=float, default=15, help="seconds of load per cell")
    ap.add_argument("--lt-venv", type=Path, required=True, help="a venv with libretranslate==1.9.6 installed")
    ap.add_argument("--package", type=Path, default=None, help="an .argosmodel to serve (default: the bundle's)")
    ap.add_argument("--argos-packages", action="store_true",
                    help="attnserve serves LibreTranslate's packages directory (ATTNSERVE_ARGOS_PACKAGES)")  # fmt: skip
    ap.add_argument("--max-length", type=int, default=None,
                    help="attnserve's requests ask this (LibreTranslate decodes up to 256 tokens)")  # fmt: skip
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="ATTNSERVE_NAME=VALUE",
                    help="a setting of attnserve's server (repeatable)")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None, help="keep the package and conversions here")
    ap.add_argument("--out", type=Path, default=DOCS, help="BENCHMARKS.md goes here (default docs/)")
    ap.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, for the section
    return args


def argos_package(bundle_dir: Path, work: Path) -> tuple[Path, dict[str, Any]]:
    """The bundle as an ``.argosmodel`` (see the module's docstring) and its metadata.json."""
    ct2 = prepare(bundle_dir, work / "prepared").ct2
    folder = work / "package" / "translate-en_ja"
    shutil.rmtree(folder.parent, ignore_errors=True)
    shutil.copytree(ct2, folder / "model")
    shutil.copyfile(bundle_dir / "spm.model", folder / "sentencepiece.model")
    config = json.loads((folder / "model" / "config.json").read_text()) | {"add_source_eos": True}
    (folder / "model" / "config.json").write_text(json.dumps(config))
    meta = {"package_version": "1.0", "argos_version": "1.0", "from_code": "en", "to_code": "ja", "type": "translate",
            "from_name": "English", "to_name": "Japanese", "links": []}  # fmt: skip
    (folder / "metadata.json").write_text(json.dumps(meta))
    archive = work / "translate-en_ja.argosmodel"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for file in sorted(folder.rglob("*")):
            z.write(file, f"{folder.name}/{file.relative_to(folder)}")
    return archive, meta


def package_meta(archive: Path) -> dict[str, Any]:
    """An .argosmodel's metadata.json (its one top folder's)."""
    with zipfile.ZipFile(archive) as z:
        name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith("/metadata.json"))
        return dict(json.loads(z.read(name)))


def lt_versions(python: Path) -> str:
    """The versions of LibreTranslate, argos-translate and CTranslate2 in LibreTranslate's venv."""
    names = ("libretranslate", "argos-translate-lt", "ctranslate2")
    code = f"from importlib.metadata import version; print(', '.join(n + ' ' + version(n) for n in {names!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def libretranslate_env(work: Path, meta: dict[str, Any]) -> dict[str, str]:
    """argos-translate's directories under ``work`` and a local package index that lists the installed package
    only (with fewer than two packages installed, LibreTranslate reads the index at start-up)."""
    index = work / "lt" / "index"
    index.mkdir(parents=True, exist_ok=True)
    (index / "index.json").write_text(json.dumps([meta]))
    return {
        "ARGOS_PACKAGES_DIR": str(work / "lt" / "packages"),
        "XDG_DATA_HOME": str(work / "lt" / "data"),
        "XDG_CACHE_HOME": str(work / "lt" / "cache"),
        "ARGOS_PACKAGE_INDEX": index.as_uri() + "/",
    }


def libretranslate_server(python: Path, env: dict[str, str]) -> Server:
    """LibreTranslate (bench/libretranslate_server.py) pinned to the server's core, ready when /languages answers."""
    port = free_port()
    command = [str(python), str(LT_SERVER), "--host", "127.0.0.1", "--port", str(port), "--load-only", "en,ja",
               "--disable-web-ui"]  # fmt: skip
    return Server(pinned(SERVER_CORE, command), port, env, ready_timeout=300, probe="/languages")


def bodies(sentences: list[str], per_request: int, options: dict[str, Any]) -> list[dict[str, Any]]:
    """/translate bodies of ``per_request`` sentences each (a string when one)."""
    chunks = [sentences[i : i + per_request] for i in range(0, len(sentences), per_request)]
    return [{"q": c[0] if per_request == 1 else c, "source": "en", "target": "ja", **options} for c in chunks]


def translate_all(url: str, sentences: list[str], options: dict[str, Any]) -> list[str]:
    """Every sentence's translation, 20 a request, one request at a time."""
    out: list[str] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for body in bodies(sentences, 20, options):
            r = client.post("/translate", json=body)
            r.raise_for_status()
            out += r.json()["translatedText"]
    return out


def measure(server: Server, sentences: list[str], options: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Each shape's sentences/s and median latency under the closed loop, then every sentence's translation."""
    import asyncio

    rows = {}
    for shape, (clients, per_request) in SHAPES.items():
        load = bodies(sentences, per_request, options)
        asyncio.run(closed_loop(server.url, load, clients, min(3.0, seconds), timeout=600))  # warm-up
        rate, median, _ = asyncio.run(closed_loop(server.url, load, clients, seconds, timeout=600))
        rows[shape] = (rate * per_request, median)
        print(f"    {shape}: {rate * per_request:.1f} sentences/s, median {median * 1000:.0f} ms", flush=True)
    return {"rows": rows, "outputs": translate_all(server.url, sentences, options), "rss": server.peak_rss_mb()}


def run(args: argparse.Namespace, work: Path) -> tuple[list[str], dict[tuple[str, str], dict[str, Any]]]:
    """Both servers under both decodings; returns the sentences and each (server, decoding)'s measurements."""
    from service.runtime.bundle import load_bundle

    archive, meta = (args.package, package_meta(args.package)) if args.package else argos_package(args.bundle, work)
    attnserve = str(Path(sys.executable).with_name("attnserve"))
    lt_env = libretranslate_env(work, meta)
    python = args.lt_venv / "bin" / "python"
    subprocess.run([str(python), str(LT_SERVER), "--install", str(archive)], env={**os.environ, **lt_env}, check=True)
    env = ATTNSERVE_ENV | dict(s.split("=", 1) for s in args.settings)
    served: Path | None = None
    if args.argos_packages:  # LibreTranslate's installation, imported by the server itself into its cache
        env |= {"ATTNSERVE_ARGOS_PACKAGES": lt_env["ARGOS_PACKAGES_DIR"], "ATTNSERVE_ARGOS_CACHE": str(work / "cache")}
        sentences = [s for s, _ in pairs(args.texts, args.sentences) if s.strip()]  # test sentences: all short
    else:
        served = work / "imported"
        subprocess.run([attnserve, "import-argos", str(archive), str(served), "--force"], check=True)
        sentences = [s for s, _ in held_out_sentences(load_bundle(served), args.texts, args.sentences)]
    options = {} if args.max_length is None else {"max_length": args.max_length}
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for decoding in (GREEDY, DEFAULTS):
        print(f"attnserve, {decoding}", flush=True)
        with attnserve_server(served, env | ATTNSERVE_DECODING[decoding], [attnserve], ready_timeout=900) as server:
            results[("attnserve", decoding)] = measure(server, sentences, options, args.seconds)
        print(f"LibreTranslate, {decoding}", flush=True)
        with libretranslate_server(python, {**lt_env, **LT_ENV[decoding]}) as server:
            results[("LibreTranslate", decoding)] = measure(server, sentences, {}, args.seconds)
    outputs = {f"{s}, {d}": r["outputs"] for (s, d), r in results.items()}
    (work / "outputs.json").write_text(json.dumps({"sentences": sentences, **outputs}, ensure_ascii=False, indent=1))
    return sentences, results


def comparable(text: str) -> str:
    """``text`` without what LibreTranslate rewrites after decoding: the last punctuation mark (made the source's),
    the first letter's case (made the source's), ``_`` (written as a space)."""
    text = (text[:-1] if text[-1:] in PUNCTUATION else text).replace("_", " ")
    return text[:1].lower() + text[1:]


def section(args: argparse.Namespace, sentences: list[str], results: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The BENCHMARKS.md section: the command, the setting, the table and the outputs compared."""
    from service.text.spans import has_spans

    argv = " ".join(shlex.quote(a) for a in args.argv)
    lines = ["| decoding | shape | attnserve (sentences/s) | LibreTranslate (sentences/s) | ratio | median latency "
             "attnserve / LibreTranslate (ms) |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for decoding in (GREEDY, DEFAULTS):
        for shape in SHAPES:
            (a, a_ms), (b, b_ms) = (results[(s, decoding)]["rows"][shape] for s in ("attnserve", "LibreTranslate"))
            lines.append(f"| {decoding} | {shape} | {a:.1f} | {b:.1f} | {a / b:.1f}× | {a_ms * 1000:.0f} / "
                         f"{b_ms * 1000:.0f} |")  # fmt: skip
    plain = {i for i, s in enumerate(sentences) if not has_spans(s)}
    compared = []
    for decoding in (GREEDY, DEFAULTS):
        ours, theirs = (results[(s, decoding)]["outputs"] for s in ("attnserve", "LibreTranslate"))
        same = {i for i in range(len(sentences)) if ours[i] == theirs[i]}
        close = {i for i in range(len(sentences)) if comparable(ours[i]) == comparable(theirs[i])}
        compared.append(f"- {decoding}: identical on {len(same)} of {len(sentences)} sentences, {len(close)} but for "
                        f"LibreTranslate's rewrites; of the {len(plain)} without a protected span, {len(same & plain)} "
                        f"and {len(close & plain)}.")  # fmt: skip
    rss = "; ".join(f"{s}, {d}: {r['rss']:.0f} MiB" for (s, d), r in results.items() if r["rss"] is not None)
    bundle = "the shipped en-ja bundle's weights through `attnserve export-marian` and CTranslate2's converter"
    package = f"`{args.package.name}`" if args.package else bundle
    from_dir = "from LibreTranslate's packages directory (`ATTNSERVE_ARGOS_PACKAGES`, imported at its first start)"
    how = from_dir if args.argos_packages else "through `attnserve import-argos`"
    settings = " ".join(f"`{x}`" for x in args.settings)
    asks = f"; attnserve's requests ask `max_length` {args.max_length}" if args.max_length else ""
    return f"""## Side by side with LibreTranslate (bench/libretranslate.py)

`python bench/libretranslate.py {argv}`

Both servers serve the same `.argosmodel`: {package}; attnserve {how}{f" with {settings}" if settings else ""}{asks},
LibreTranslate ({args.lt_versions}) installed into argos-translate's packages directory, offline (its sentence
splitter replaced by one that keeps each text whole, as attnserve is set to decode each text whole; a local package
index). Each server
alone, pinned to one core (`taskset -c {SERVER_CORE}`), the closed-loop load generator on core {CLIENT_CORE},
{args.seconds:g} s a cell after a warm-up, {len(sentences)} held-out sentences of the test split, one sentence a
text. Greedy: attnserve one thread (its defaults), LibreTranslate `ARGOS_BEAM_SIZE=1` and one CTranslate2 thread;
LibreTranslate's defaults: beam 4 and its thread settings, attnserve `ATTNSERVE_DEFAULT_BEAM_SIZE=4
ATTNSERVE_DEFAULT_LENGTH_PENALTY=0.2` (argos-translate's), the requests naming neither, as Weblate's. The machine was
shared with other work: load average {args.load:.1f} on its {os.cpu_count()} cores when the run began.

Peak RSS: {rss}.

{chr(10).join(lines)}

Outputs compared (each server translating every sentence once more, 20 a request):

{chr(10).join(compared)}

They are not all the same by design. LibreTranslate rewrites what the model decoded: it makes the last punctuation
mark the source's (`improve_translation_formatting`: a `。` becomes `.`, a missing `.` is added) and the first
letter's case the source's, and writes `_` as a space ("but for LibreTranslate's rewrites" undoes these three on both
sides before comparing). attnserve replaces protected spans
(placeholders, tags) by stand-ins before decoding and restores them after; argos-translate asks CTranslate2 for
`replace_unknowns` (an `<unk>` replaced by the source token it attends to most) and its `min_decoding_length=1`, which
attnserve does not copy (docs/MODELS.md).
"""


def compare(args: argparse.Namespace) -> str:
    """Both servers measured (this process pinned to the load generator's core); returns the section."""
    args.lt_versions = lt_versions(args.lt_venv / "bin" / "python")
    args.load = os.getloadavg()[0]
    os.sched_setaffinity(0, {int(CLIENT_CORE)})  # the load generator; the servers run on SERVER_CORE
    work = args.work or Path(tempfile.mkdtemp(prefix="libretranslate-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        sentences, results = run(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return section(args, sentences, results)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    body = compare(args)
    if args.no_write:
        print(body)
    else:
        write_section("libretranslate", body, args.out / "BENCHMARKS.md")
        print(f"wrote {args.out / 'BENCHMARKS.md'}")


if __name__ == "__main__":
    main()
