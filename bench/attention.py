"""/attention's encodings for a maximal text: bytes on the wire and seconds end to end, JSON against compact arrays.

Starts ``attnserve serve`` on the shipped bundle, force-decodes a 256-token source into a 256-token target (every
attention kind, every layer and head), and times each encoding with and without gzip: request to arrays in the
client's hands (parsed, and decoded to numpy), median of the repeats. Writes its section of docs/BENCHMARKS.md.

    python bench/attention.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import httpx
from common import CORPUS, ROOT, attnserve_server, pairs, write_section
from tqdm import tqdm

from service.http import arrays
from service.runtime.bundle import load_bundle

KINDS = ("encoder", "decoder", "cross")


def maximal_text(path: Path, tokens: int, side: int) -> tuple[str, int]:
    """Test sentences (source or reference side) joined until the next would pass ``tokens`` tokens."""
    tokenizer = load_bundle(ROOT / "model" / "bundles" / "en-ja").tokenizer
    encode = tokenizer.encode_source if side == 0 else tokenizer.encode_target
    text, n = "", 0
    for pair in pairs(path, 5000):
        piece = pair[side]
        if not piece:
            continue
        joined = f"{text} {piece}".strip() if side == 0 else text + piece
        if len(encode(joined)) > tokens:
            continue
        text, n = joined, len(encode(joined))
    return text, n


def fetch(url: str, body: dict[str, object], gzipped: bool) -> tuple[int, float]:
    """One request to arrays in hand: (bytes on the wire, seconds)."""
    headers = {"Accept-Encoding": "gzip" if gzipped else "identity"}
    t0 = time.perf_counter()
    with httpx.Client(timeout=120) as client:
        r = client.post(url + "/attention", json=body, headers=headers)
        r.raise_for_status()
        wire = int(r.headers["content-length"])  # compressed bytes when gzipped (httpx decompresses the body)
        got = r.json()
        for kind in KINDS:
            arrays.decode(got[kind])
    return wire, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=Path, default=CORPUS)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    source, S = maximal_text(args.texts, args.tokens, 0)
    target, T = maximal_text(args.texts, args.tokens - 1, 1)  # the step that predicts </s> is the 256th
    body: dict[str, object] = {"q": source, "source": "en", "target": "ja", "target_text": target}
    rows: dict[tuple[str, bool], list[tuple[int, float]]] = {}
    env = {"ATTNSERVE_THREADS": "1", "ATTNSERVE_SENTENCE_SPLIT_CHARS": "5000"}  # the maximal text: one segment
    with attnserve_server(ROOT / "model" / "bundles" / "en-ja", env) as server:
        fetch(server.url, body, False)  # warm-up
        runs = [(e, z) for e in ("json", "float16", "uint8") for z in (False, True)]
        for _ in tqdm(range(args.repeats), desc="repeats"):
            for encoding, gzipped in runs:  # interleaved
                rows.setdefault((encoding, gzipped), []).append(
                    fetch(server.url, {**body, "encoding": encoding}, gzipped)
                )
    base_bytes = statistics.median(b for b, _ in rows["json", False])
    base_seconds = statistics.median(s for _, s in rows["json", False])
    lines = []
    for (encoding, gzipped), runs_ in rows.items():
        b, s = statistics.median(b for b, _ in runs_), statistics.median(s for _, s in runs_)
        lines.append(
            f"| {encoding}{' + gzip' if gzipped else ''} | {b / 1e6:.2f} | {base_bytes / b:.1f}× | "
            f"{s:.3f} | {base_seconds / s:.1f}× |"
        )
    table = "\n".join(lines)
    section = f"""## /attention encodings (bench/attention.py)

`python bench/attention.py --repeats {args.repeats}` — the shipped bundle, one thread, a {S}-token source
force-decoded into a {T}-token target, every kind, layer and head; seconds from request to arrays decoded into numpy
in the client (httpx), median of {args.repeats} interleaved repeats, on loopback.

| encoding | MB on the wire | smaller than JSON | seconds | faster than JSON |
|---|---|---|---|---|
{table}
"""
    print(section)
    write_section("attention", section)


if __name__ == "__main__":
    main()
