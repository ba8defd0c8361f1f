"""bench/overhead.py: the mixed load run in the same rounds as the closed loop, the servers free to use every core;
the identity lines under the table."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from overhead import MIXED, Run, identity, mixed_run, mixed_table

from service.runtime.bundle import load_bundle

TEXTS = ["Open file", "Settings", "Could not open the file because it is locked by another program.", "Save"] * 5


def test_mixed_runs_record_each_batching_and_pin_the_load_generator_back(tiny_bundle: Path) -> None:
    bundle = load_bundle(tiny_bundle, verify=False)
    mixed = [(t, bundle.tokenizer.encode_source(t)) for t in TEXTS]
    args = argparse.Namespace(mixed_rate=20.0, mixed_seconds=1.0)
    runs = {f"{MIXED}, {b} batching": Run(f"{MIXED}, {b} batching") for b in ("continuous", "request-level")}
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(pinned)})  # as bench/overhead.py pins its load generator
    try:
        for _ in range(2):  # two rounds
            for setting, run in zip(("true", "false"), runs.values(), strict=True):
                mixed_run(bundle, mixed, args, setting, run)
        assert os.sched_getaffinity(0) == {min(pinned)}
    finally:
        os.sched_setaffinity(0, pinned)
    for run in runs.values():
        assert run.requests > 0 and run.errors == 0
        assert len(run.short_p99) == len(run.long_p99) == len(run.rates) == 2
        assert all(math.isfinite(p) and p > 0 for p in run.short_p99)
    table = mixed_table(args, runs)
    assert f"| {MIXED}, continuous batching | **" in table
    assert f"| {MIXED}, request-level batching | **" in table
    assert table.count(f"0/{runs[f'{MIXED}, continuous batching'].requests} |") == 2


def test_identity_counts_answers_on_the_texts_without_spans_and_gives_both_sets_lengths() -> None:
    runs = {name: Run(name) for name in ("CTranslate2 float32", "attnserve float32", "attnserve int8")}
    runs["CTranslate2 float32"].outputs = {0: "a", 1: "b", 2: "c", 3: "d"}
    runs["attnserve float32"].outputs = {0: "a", 1: "other", 2: "c", 3: "d"}
    runs["attnserve int8"].outputs = {0: "x", 1: "other", 2: "c", 3: "y"}
    lines = identity(runs, [True, False, True, True], [4, 9, 6, 8]).splitlines()
    assert lines[0].startswith("- 1 of the 4 texts have spans")
    assert lines[0].endswith("They average 9.0 source tokens against the others' 6.0 (all 4: 6.8)")
    assert lines[1:] == [
        "- attnserve float32 answers identical to CTranslate2 float32's: 3/3",
        "- attnserve int8 answers identical to CTranslate2 float32's: 1/3",
    ]
    assert "average" not in identity(runs, [True] * 4, [4, 9, 6, 8])
