"""Parity with Hugging Face's MarianMTModel (eager attention), both directions, through the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import torch
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

from service.cli.main import main
from service.decoding import DecodeRequest, DecodeResult, decode
from service.runtime.bundle import load_bundle
from service.runtime.runner import open_runner
from tests.bundles import SENTENCES, make_tiny_bundle, tiny_spm

TEXTS = ["Open file", "Delete the selected files?", "Settings", "The file {0} already exists. Replace it?"]
MAX_NEW = 10


def random_marian(out_dir: Path, spm: Path) -> Path:
    """A random MarianMTModel (swish, tied embeddings, final logits bias, 2+3 layers) with opus-mt tokenizer files."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    V = sp.get_piece_size()
    config = MarianConfig(
        vocab_size=V,
        decoder_vocab_size=V,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        max_position_embeddings=64,
        pad_token_id=V - 1,
        eos_token_id=0,
        decoder_start_token_id=V - 1,
        bad_words_ids=[[V - 1]],
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():  # large enough weights that outputs depend on the input
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
        model.model.shared.weight[V - 1].zero_()
        model.final_logits_bias.normal_(0.0, 1.0)
    model.save_pretrained(out_dir)
    for role in ("source", "target"):
        shutil.copyfile(spm, out_dir / f"{role}.spm")
    vocab = {sp.id_to_piece(i): i for i in range(V)}
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "ja"}))
    return out_dir


def hf_outputs(hf_dir: Path, texts: list[str]) -> tuple[list[list[int]], list[dict[str, np.ndarray]], list]:
    """Greedy tokens from generate(), and the attentions of a teacher-forced pass over them."""
    model = MarianMTModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    tok = MarianTokenizer.from_pretrained(hf_dir)
    tokens, attentions, sources = [], [], []
    for text in texts:
        enc = tok(text, return_tensors="pt")
        sources.append(enc.input_ids[0].tolist())
        with torch.no_grad():
            out = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW)
            generated = out[0, 1:].tolist()
            forward = model(**enc, decoder_input_ids=out[:, :-1], output_attentions=True)  # T queries
        tokens.append(generated)
        attentions.append(
            {
                "encoder": torch.stack(forward.encoder_attentions)[:, 0].numpy(),  # (L, h, S, S)
                "decoder": torch.stack(forward.decoder_attentions)[:, 0].numpy(),  # (L, h, T, T)
                "cross": torch.stack(forward.cross_attentions)[:, 0].numpy(),  # (L, h, T, S)
            }
        )
    return tokens, attentions, sources


def bundle_outputs(bundle_dir: Path, texts: list[str]) -> list[DecodeResult]:
    bundle = load_bundle(bundle_dir)
    requests = [DecodeRequest(src=bundle.tokenizer.encode_source(t), max_length=MAX_NEW, attention=True) for t in texts]
    return decode(open_runner(bundle, "cpu"), requests)


def assert_same(results: list[DecodeResult], tokens: list[list[int]], attentions: list[dict[str, np.ndarray]]) -> None:
    for result, want, att in zip(results, tokens, attentions, strict=True):
        hyp = result.hypotheses[0]
        assert hyp.tokens == want
        T = att["cross"].shape[2]
        assert result.encoder_attention is not None
        np.testing.assert_allclose(result.encoder_attention, att["encoder"], atol=1e-4)
        for t in range(T):
            np.testing.assert_allclose(hyp.cross_attention[t], att["cross"][:, :, t], atol=1e-4)
            np.testing.assert_allclose(hyp.self_attention[t], att["decoder"][:, :, t, : t + 1], atol=1e-4)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marian")


def test_import_marian_matches_transformers(work: Path) -> None:
    hf_dir = random_marian(work / "hf", tiny_spm(work))
    assert main(["import-marian", str(hf_dir), str(work / "bundle")]) == 0
    tokens, attentions, sources = hf_outputs(hf_dir, TEXTS)
    bundle = load_bundle(work / "bundle")
    assert [bundle.tokenizer.encode_source(t) for t in TEXTS] == sources  # the same ids as MarianTokenizer
    assert len({tuple(t) for t in tokens}) > 1, "the random model's outputs should depend on the input"
    assert_same(bundle_outputs(work / "bundle", TEXTS), tokens, attentions)


def test_export_marian_round_trip(work: Path) -> None:
    bundle_dir = make_tiny_bundle(work / "ours", work / "ours-spm", seed=5, activation="swish")
    assert main(["export-marian", str(bundle_dir), str(work / "exported")]) == 0
    tokens, attentions, _ = hf_outputs(work / "exported", SENTENCES[:4])
    ours = bundle_outputs(bundle_dir, SENTENCES[:4])
    assert_same(ours, tokens, attentions)

    assert main(["import-marian", str(work / "exported"), str(work / "reimported")]) == 0
    again = bundle_outputs(work / "reimported", SENTENCES[:4])
    for a, b in zip(ours, again, strict=True):
        assert a.hypotheses[0].tokens == b.hypotheses[0].tokens
        np.testing.assert_array_equal(a.encoder_attention, b.encoder_attention)
        for x, y in zip(a.hypotheses[0].cross_attention, b.hypotheses[0].cross_attention, strict=True):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(("penalty", "ngram"), [(1.5, 0), (1.0, 2), (1.3, 3)])
def test_repetition_penalties_match_transformers(work: Path, penalty: float, ngram: int) -> None:
    """Greedy decoding with transformers' repetition penalty and n-gram ban gives its tokens."""
    hf_dir = work / "hf"
    if not (work / "bundle").exists():
        random_marian(hf_dir, tiny_spm(work))
        assert main(["import-marian", str(hf_dir), str(work / "bundle")]) == 0
    model = MarianMTModel.from_pretrained(hf_dir).eval()
    tok = MarianTokenizer.from_pretrained(hf_dir)
    bundle = load_bundle(work / "bundle")
    requests = [
        DecodeRequest(
            src=bundle.tokenizer.encode_source(t), max_length=MAX_NEW,
            repetition_penalty=penalty, no_repeat_ngram_size=ngram,
        )
        for t in TEXTS
    ]  # fmt: skip
    runner = open_runner(bundle, "cpu")
    ours = [r.hypotheses[0].tokens for r in decode(runner, requests)]
    unpenalized = [DecodeRequest(r.src, max_length=MAX_NEW) for r in requests]
    plain = [r.hypotheses[0].tokens for r in decode(runner, unpenalized)]
    assert ours != plain, "the penalties should change the random model's outputs"
    for text, tokens in zip(TEXTS, ours, strict=True):
        with torch.no_grad():
            out = model.generate(
                **tok(text, return_tensors="pt"), num_beams=1, do_sample=False, max_new_tokens=MAX_NEW,
                repetition_penalty=penalty, no_repeat_ngram_size=ngram,
            )  # fmt: skip
        assert tokens == out[0, 1:].tolist()
