"""``attnserve derive`` on an ``import-marian`` bundle: int8 graphs whose greedy tokens agree with the bundle's
float32 ones about as often as CTranslate2's int8 agrees with its float32 on the same model and texts."""

from __future__ import annotations

from pathlib import Path

import ctranslate2
import sentencepiece

from service.cli.main import main
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.runner import open_runner
from tests.bundles import tiny_spm
from tests.model.importers.argos_packages import texts
from tests.model.importers.test_marian import random_marian

N_TEXTS = 300
MAX_LENGTH = 20
POINTS = 0.03  # how far below CTranslate2's agreement ours may fall


def agreement(a: list[list[str]], b: list[list[str]]) -> float:
    """The share of texts whose whole token sequences are equal."""
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def ours(bundle: Bundle, batch: list[str], variant: str) -> list[list[str]]:
    requests = [DecodeRequest(src=bundle.tokenizer.encode_source(t), beam_size=1, max_length=MAX_LENGTH) for t in batch]
    results = decode(
        open_runner(bundle, "cpu", variant=variant, role="fast_decoder" if variant == "float32" else "decoder"),
        requests,
    )
    return [bundle.tokenizer.pieces(r.hypotheses[0].tokens) for r in results]


def ctranslate2_tokens(model_dir: Path, spm: Path, batch: list[str], compute_type: str) -> list[list[str]]:
    """CTranslate2's greedy tokens for the Marian model as its converter writes it, </s> included as ours are."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type)
    results = translator.translate_batch(
        [[*sp.encode(t, out_type=str), "</s>"] for t in batch],
        beam_size=1,
        max_decoding_length=MAX_LENGTH,
        min_decoding_length=0,
        replace_unknowns=False,
    )
    return [[*r.hypotheses[0], "</s>"][:MAX_LENGTH] for r in results]


def test_derived_int8_agrees_with_float32_as_ctranslate2_int8_does(tmp_path: Path) -> None:
    spm = tiny_spm(tmp_path)
    hf = random_marian(tmp_path / "hf", spm)
    assert main(["import-marian", str(hf), str(tmp_path / "bundle")]) == 0
    assert main(["derive", str(tmp_path / "bundle")]) == 0
    bundle = load_bundle(tmp_path / "bundle")
    batch = texts(N_TEXTS, spm, 40, seed=2)
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(tmp_path / "ct2"), force=True)
    theirs = [ctranslate2_tokens(tmp_path / "ct2", spm, batch, c) for c in ("float32", "int8")]
    float32, int8 = ours(bundle, batch, "float32"), ours(bundle, batch, "int8")
    assert agreement(float32, theirs[0]) > 0.95  # the same model on both sides
    mine, reference = agreement(int8, float32), agreement(theirs[1], theirs[0])
    assert mine >= reference - POINTS, f"int8 = float32: attnserve {mine:.3f}, CTranslate2 {reference:.3f}"
