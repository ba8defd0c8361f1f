"""``attnserve import-argos``: the imported bundle decodes the tokens CTranslate2 decodes (compute_type float32) on
the same package, greedy and beam 4, for OpenNMT-py packages (float32, int8, float16, and one with a target prefix)
and an OPUS-MT-style one."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.importers.argos import read_vocabulary
from service.cli.main import main
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.manifest import Manifest
from service.runtime.runner import open_runner
from service.serving.engine import Engine
from service.serving.translation import Options
from service.settings import Settings
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
    results = decode(open_runner(bundle, "cpu", variant=variant, role="fast_decoder" if fast else "decoder"), requests)
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
    manifest = Manifest.read(tmp_path / "bundle")
    assert (manifest.source_lang, manifest.target_lang) == ("en", "ja")
    assert manifest.model["normalize_before"] and manifest.model["position_table"] == "weights"
    assert (quantization or "float32") in manifest.provenance["ctranslate2"]["weights"]
    assert "int8" in manifest.variants  # derived from the float32 weights on first load
    assert manifest.default_variant == ("int8" if quantization == "int8" else "float32")
    bos = [2] if config.get("add_source_bos") else []  # <s> and </s> in OpenNMT-py's vocabulary
    eos = [3] if config.get("add_source_eos") else []
    assert (manifest.tokenizer["source_prefix"], manifest.tokenizer["source_suffix"]) == (bos, eos)
    assert_parity(package, tmp_path / "bundle")


def test_opus_mt_package_matches_ctranslate2(tmp_path: Path, spm: Path) -> None:
    package = marian_package(tmp_path, random_marian(tmp_path / "hf", spm), spm, {})
    archive = zip_package(package, tmp_path / "en_ja.argosmodel")
    assert main(["import-argos", str(archive), str(tmp_path / "bundle")]) == 0
    model = Manifest.read(tmp_path / "bundle").model
    assert not model["normalize_before"]
    assert model["decoder_start_id"] == model["pad_id"]  # a zero embedding, as CTranslate2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "ct2", "en_ja.argosmodel", "hf", "package"]
    assert_parity(package, tmp_path / "bundle")


def test_a_target_prefix_is_forced_and_left_out_as_argos_translate_does(tmp_path: Path, spm: Path) -> None:
    """A multilingual model's package (its target language token in metadata.json's ``target_prefix``): the bundle
    forces it, exact graphs and fast decoder alike, and answers CTranslate2's tokens after it."""
    package = onmt_package(tmp_path, spm, None, {}, seed=3, target_prefix="__ja__")
    assert main(["import-argos", str(package), str(tmp_path / "bundle")]) == 0
    prefix = Manifest.read(tmp_path / "bundle").tokenizer["target_prefix"]
    assert prefix == [read_vocabulary(package / "model").index("__ja__")]
    assert_parity(package, tmp_path / "bundle", runners=(False, True))


def test_a_head_size_that_is_no_multiple_of_8_imports_and_matches_ctranslate2(tmp_path: Path, spm: Path) -> None:
    """d 48, 4 heads: heads of 12, which ONNX Runtime's GroupQueryAttention refuses; the bundle's graphs, its int8
    ones included, use attnserve's kernels, which take any head size."""
    package = onmt_package(tmp_path, spm, "int8", {}, d=48)
    assert main(["import-argos", str(package), str(tmp_path / "bundle")]) == 0
    bundle = load_bundle(tmp_path / "bundle")
    assert (bundle.spec.d_model, bundle.spec.h) == (48, 4)
    assert_parity(package, tmp_path / "bundle", runners=(False, True))
    assert all(
        len(t) > 0 for t in ours(bundle, texts(8, package / "sentencepiece.model", MAX_PIECES), 4, variant="int8")
    )


def test_an_int8_package_is_served_in_int8_unless_the_setting_says_otherwise(
    tmp_path: Path, spm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its bundle records int8 as its default variant: with no setting /translate decodes on the int8 graphs, with
    ``ATTNSERVE_GRAPH_VARIANT=float32`` on the float32 ones (CTranslate2's float32 tokens)."""
    package = onmt_package(tmp_path, spm, "int8", {})
    assert main(["import-argos", str(package), str(tmp_path / "bundle")]) == 0
    bundle = load_bundle(tmp_path / "bundle")
    batch = [t for t in texts(60, package / "sentencepiece.model", MAX_PIECES) if not set(t) & set("{}%")]  # no spans
    options = Options(max_length=MAX_LENGTH, length_penalty=LENGTH_PENALTY)
    tok = bundle.tokenizer
    for setting, variant in ((None, "int8"), ("float32", "float32")):
        if setting:
            monkeypatch.setenv("ATTNSERVE_GRAPH_VARIANT", setting)
        engine = Engine.load(bundle.path, Settings(bundles=[bundle.path], _env_file=None))
        assert engine.variant == variant
        got = [t.text for t in engine.translate_now(batch, options)]
        pieces = ours(bundle, batch, 1, variant=variant, fast=variant == "float32")
        assert got == [tok.target.decode_pieces(p) for p in pieces]
    assert ours(bundle, batch, 1, fast=True) == reference(package, batch, 1, MAX_LENGTH, LENGTH_PENALTY)
    assert ours(bundle, batch, 1, variant="int8") != ours(bundle, batch, 1, fast=True)  # the int8 graphs served
