"""Tests of model/corpus/split.py: the split is deterministic and by normalized source."""

from __future__ import annotations

from model.corpus.split import split_key, split_of


def test_split_is_deterministic_and_by_normalized_source() -> None:
    sources = [f"Message number {i}" for i in range(20000)]
    splits = [split_of(s) for s in sources]
    assert splits == [split_of(s) for s in sources]
    assert {"train", "dev", "test"} <= set(splits)
    assert 0.009 < splits.count("test") / len(splits) < 0.015
    assert split_key("Open File...") == split_key("open file") == split_key("Open  File:")
    assert split_of("Open File...") == split_of("open file")


def test_split_keeps_every_translation_of_a_source_together() -> None:
    pairs = [(f"Item {i}", f"項目 {i}{variant}") for i in range(3000) for variant in ("", "です")]
    by_split: dict[str, set[str]] = {"train": set(), "dev": set(), "test": set()}
    for source, _ in pairs:
        by_split[split_of(source)].add(source)
    assert not by_split["train"] & by_split["dev"]
    assert not by_split["train"] & by_split["test"]
    assert not by_split["dev"] & by_split["test"]
