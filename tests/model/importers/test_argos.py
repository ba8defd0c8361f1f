"""``attnserve import-argos``: the imported bundle decodes the tokens CTranslate2 decodes (compute_type float32) on
the same package, greedy and beam 4, for OpenNMT-py packages (float32, int8, float16, and one with a target prefix)
and an OPUS-MT-style one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.importers.argos import read_vocabulary
from service.cli.main import main
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.runner import Runner
from tests.bundles import tiny_spm
from tests.model.importers.argos_packages import (
    marian_package,
    onmt_package,
    reference,
    texts,
    zip_package,
)
from tests.model.importers.test_marian import random_marian

N_TEXTS = 200
MAX_LENGTH = 20
LENGTH_PENALTY = 0.2  # argos-translate's
MAX_PIECES = 40  # the OPUS-MT-style model has 64 positions


def ours(bundle: Bundle, batch: list[str], beam: int, fast: bool = False, variant: str = "float32") -> list[list[str]]:
    """The bundle's tokens, every text in one batch, on its exact graphs, its fast decoder or a ``variant``'s."""
    tok = bundle.tokenizer
    requests = [
        DecodeRequest(
            src=tok.encode_source(t),
            beam_size=beam,
            max_length=MAX_LENGTH,
            length_penalty=LENGTH_PENALTY,
            prefix=tok.target_prefix,
        )
        for t in batch
    ]
    eos = bundle.spec.eos_id
    results = decode(Runner(bundle, "cpu", variant=variant, fast=fast), requests)
    return [tok.pieces([i for i in r.hypotheses[0].tokens if i != eos]) for r in results]


def assert_parity(package: Path, bundle_dir: Path, runners: tuple[bool, ...] = (False,)) -> None:
    """The bundle (exact graphs, and the fast decoder with ``runners`` (True,)) decodes CTranslate2's tokens."""
    bundle = load_bundle(bundle_dir)
    batch = texts(N_TEXTS, package / "sentencepiece.model", MAX_PIECES)
    for beam in (1, 4):
        want = reference(package, batch, beam, MAX_LENGTH, LENGTH_PENALTY)
        assert len({tuple(w) for w in want}) > N_TEXTS // 20, "the random model's outputs should depend on the input"
        for fast in runners:
            got = ours(bundle, batch, beam, fast)
            differ = [(t, g, w) for t, g, w in zip(batch, got, want, strict=True) if g != w]
            assert not differ, f"beam {beam}, fast {fast}: {len(differ)} of {N_TEXTS} differ, first {differ[0]}"


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_spm(tmp_path_factory.mktemp("spm"))


@pytest.mark.parametrize(
    ("quantization", "config"),
    [(None, {}), ("int8", {"add_source_bos": True, "add_source_eos": True}), ("float16", {"add_source_eos": True})],
    ids=["float32", "int8-bos-eos", "float16-eos"],
)
def test_opennmt_py_package_matches_ctranslate2(
    tmp_path: Path, spm: Path, quantization: str | None, config: dict[str, bool]
) -> None:
    package = onmt_package(tmp_path, spm, quantization, config)
    assert main(["import-argos", str(package), str(tmp_path / "bundle")]) == 0
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert (manifest["source_lang"], manifest["target_lang"]) == ("en", "ja")
    assert manifest["model"]["normalize_before"] and manifest["model"]["position_table"] == "weights"
    assert (quantization or "float32") in manifest["provenance"]["ctranslate2"]["weights"]
    assert "int8" in manifest["graphs"]  # derived from the float32 weights on first load
    bos = [2] if config.get("add_source_bos") else []  # <s> and </s> in OpenNMT-py's vocabulary
    eos = [3] if config.get("add_source_eos") else []
    assert (manifest["tokenizer"]["source_prefix"], manifest["tokenizer"]["source_suffix"]) == (bos, eos)
    assert_parity(package, tmp_path / "bundle")


def test_opus_mt_package_matches_ctranslate2(tmp_path: Path, spm: Path) -> None:
    package = marian_package(tmp_path, random_marian(tmp_path / "hf", spm), spm, {})
    archive = zip_package(package, tmp_path / "en_ja.argosmodel")
    assert main(["import-argos", str(archive), str(tmp_path / "bundle")]) == 0
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert not manifest["model"]["normalize_before"]
    assert manifest["model"]["decoder_start_id"] == manifest["model"]["pad_id"]  # a zero embedding, as CTranslate2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "ct2", "en_ja.argosmodel", "hf", "package"]
    assert_parity(package, tmp_path / "bundle")


def test_a_target_prefix_is_forced_and_left_out_as_argos_translate_does(tmp_path: Path, spm: Path) -> None:
    """A multilingual model's package (its target language token in metadata.json's ``target_prefix``): the bundle
    forces it, exact graphs and fast decoder alike, and answers CTranslate2's tokens after it."""
    package = onmt_package(tmp_path, spm, None, {}, seed=3, target_prefix="__ja__")
    assert main(["import-argos", str(package), str(tmp_path / "bundle")]) == 0
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["tokenizer"]["target_prefix"] == [read_vocabulary(package / "model").index("__ja__")]
    assert_parity(package, tmp_path / "bundle", runners=(False, True))
