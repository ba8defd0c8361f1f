"""Argos packages built as real ones are: a random OpenNMT-py checkpoint (OpenNMT-py v3's layout) through
CTranslate2's ``OpenNMTPyConverter``, a random MarianMTModel through its ``TransformersConverter``; and CTranslate2
itself as the reference, fed as argos-translate feeds it (bare SentencePiece pieces)."""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any

import ctranslate2
import sentencepiece
import torch

from tests.bundles import SENTENCES

ONMT_SPECIALS = ["<unk>", "<blank>", "<s>", "</s>"]


def texts(n: int, spm: Path, max_pieces: int, seed: int = 0) -> list[str]:
    """``n`` short texts of at most ``max_pieces`` pieces: words of the test sentences, shuffled and recombined."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    words = " ".join(SENTENCES).split()
    rng = random.Random(seed)
    found: list[str] = []
    while len(found) < n:
        text = " ".join(rng.choices(words, k=rng.randint(1, 6)))
        if len(sp.encode(text)) <= max_pieces:
            found.append(text)
    return found


def onmt_pe(max_len: int, d: int) -> torch.Tensor:
    """OpenNMT-py's position table: sines and cosines interleaved, computed in float32 -> (max_len, 1, d)."""
    pe = torch.zeros(max_len, d)
    position = torch.arange(0, max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d, 2, dtype=torch.float) * -(math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(position.float() * div_term)
    pe[:, 1::2] = torch.cos(position.float() * div_term)
    return pe.unsqueeze(1)


def _linear(state: dict[str, torch.Tensor], name: str, d_out: int, d_in: int, g: torch.Generator) -> None:
    state[f"{name}.weight"] = torch.randn(d_out, d_in, generator=g) * 0.3
    state[f"{name}.bias"] = torch.randn(d_out, generator=g) * 0.1


def _norm(state: dict[str, torch.Tensor], name: str, d: int, g: torch.Generator) -> None:
    state[f"{name}.weight"] = 1 + torch.randn(d, generator=g) * 0.1
    state[f"{name}.bias"] = torch.randn(d, generator=g) * 0.1


def _attention(state: dict[str, torch.Tensor], name: str, d: int, g: torch.Generator) -> None:
    for proj in ("linear_query", "linear_keys", "linear_values", "final_linear"):
        _linear(state, f"{name}.{proj}", d, d, g)


def _ffn(state: dict[str, torch.Tensor], name: str, d: int, d_ff: int, g: torch.Generator) -> None:
    _linear(state, f"{name}.w_1", d_ff, d, g)
    _linear(state, f"{name}.w_2", d, d_ff, g)
    _norm(state, f"{name}.layer_norm", d, g)


def onmt_checkpoint(path: Path, vocab: list[str], seed: int = 0, d: int = 32, d_ff: int = 64, layers: int = 2,
                    heads: int = 4, positions: int = 128) -> Path:  # fmt: skip
    """A random pre-norm OpenNMT-py v3 Transformer checkpoint (shared, tied embeddings, a generator bias)."""
    g = torch.Generator().manual_seed(seed)
    V = len(vocab)
    emb = torch.randn(V, d, generator=g) * d**-0.5 * 3
    state: dict[str, torch.Tensor] = {}
    for stack in ("encoder", "decoder"):
        state[f"{stack}.embeddings.make_embedding.emb_luts.0.weight"] = emb
        state[f"{stack}.embeddings.make_embedding.pe.pe"] = onmt_pe(positions, d)
        _norm(state, f"{stack}.layer_norm", d, g)
    for i in range(layers):
        e = f"encoder.transformer.{i}"
        _attention(state, f"{e}.self_attn", d, g)
        _norm(state, f"{e}.layer_norm", d, g)
        _ffn(state, f"{e}.feed_forward", d, d_ff, g)
        t = f"decoder.transformer_layers.{i}"
        _attention(state, f"{t}.self_attn", d, g)
        _norm(state, f"{t}.layer_norm_1", d, g)
        _attention(state, f"{t}.context_attn", d, g)
        _norm(state, f"{t}.layer_norm_2", d, g)
        _ffn(state, f"{t}.feed_forward", d, d_ff, g)
    opt = argparse.Namespace(
        encoder_type="transformer",
        decoder_type="transformer",
        self_attn_type="scaled-dot",
        pos_ffn_activation_fn="relu",
        position_encoding=True,
        max_relative_positions=0,
        enc_layers=layers,
        dec_layers=layers,
        heads=heads,
        feat_merge="concat",
        lambda_align=0.0,
    )
    generator = {"weight": emb, "bias": torch.randn(V, generator=g) * 0.3}
    torch.save({"model": state, "generator": generator, "vocab": {"src": vocab, "tgt": vocab}, "opt": opt}, path)
    return path


def onmt_vocab(spm: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """OpenNMT-py's layout: <unk> <blank> <s> </s>, then the SentencePiece pieces, then ``extra`` tokens (a
    multilingual model's language tokens)."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return ONMT_SPECIALS + [p for p in pieces if p not in (*ONMT_SPECIALS, "<pad>")] + list(extra)


def write_package(folder: Path, ct2_dir: Path, spm: Path, meta: dict[str, Any], config: dict[str, Any]) -> Path:
    """An unpacked Argos package: metadata.json, sentencepiece.model, model/ (config.json updated with ``config``)."""
    folder.mkdir(parents=True)
    shutil.copytree(ct2_dir, folder / "model")
    shutil.copyfile(spm, folder / "sentencepiece.model")
    (folder / "metadata.json").write_text(json.dumps({"package_version": "1.0", "type": "translate", **meta}))
    path = folder / "model" / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | config))
    return folder


def onmt_package(
    work: Path,
    spm: Path,
    quantization: str | None,
    config: dict[str, Any],
    seed: int = 0,
    target_prefix: str = "",
    d: int = 32,
    *,
    heads: int = 4,
    d_ff: int | None = None,
    layers: int = 2,
    positions: int = 128,
    vocab_size: int | None = None,
) -> Path:
    """An OpenNMT-py package of width ``d`` (``d_ff`` by default 2 × ``d``), converted by CTranslate2
    (``quantization`` None keeps float32); a ``target_prefix`` is a token of its own at the vocabulary's end and
    metadata.json's ``target_prefix``; ``vocab_size`` pads the vocabulary with pieces the tokenizer never makes."""
    extra = (target_prefix,) if target_prefix else ()
    vocab = onmt_vocab(spm, extra)
    vocab += [f"▁filler{i}" for i in range((vocab_size or 0) - len(vocab))]
    ckpt = onmt_checkpoint(work / "model.pt", vocab, seed, d=d, d_ff=d_ff or 2 * d, layers=layers, heads=heads,
                           positions=positions)  # fmt: skip
    ctranslate2.converters.OpenNMTPyConverter(str(ckpt), unsafe_deserialization=True).convert(
        str(work / "ct2"), quantization=quantization, force=True
    )
    meta = {"from_code": "en", "to_code": "ja"} | ({"target_prefix": target_prefix} if target_prefix else {})
    return write_package(work / "package", work / "ct2", spm, meta, config)


def marian_package(work: Path, hf_dir: Path, spm: Path, config: dict[str, Any]) -> Path:
    """An OPUS-MT-style package: a MarianMTModel directory through CTranslate2's TransformersConverter."""
    ctranslate2.converters.TransformersConverter(str(hf_dir)).convert(str(work / "ct2"), force=True)
    return write_package(work / "package", work / "ct2", spm, {"from_code": "en", "to_code": "ja"}, config)


def zip_package(folder: Path, path: Path) -> Path:
    """An .argosmodel: the package folder zipped as one top folder."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for file in sorted(folder.rglob("*")):
            z.write(file, f"{folder.name}/{file.relative_to(folder)}")
    return path


def reference(package: Path, texts: list[str], beam: int, max_length: int, lp: float) -> list[list[str]]:
    """CTranslate2's tokens (compute_type float32), fed as argos-translate feeds it: bare SentencePiece pieces, and
    metadata.json's ``target_prefix`` as the target prefix, left out of the tokens returned."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(package / "sentencepiece.model"))
    translator = ctranslate2.Translator(str(package / "model"), device="cpu", compute_type="float32")
    prefix = json.loads((package / "metadata.json").read_text()).get("target_prefix", "")
    results = translator.translate_batch(
        [sp.encode(t, out_type=str) for t in texts],
        target_prefix=[[prefix]] * len(texts) if prefix else None,
        beam_size=beam,
        num_hypotheses=1,
        length_penalty=lp,
        max_decoding_length=max_length,  # generated tokens, </s> included, as our max_length
        min_decoding_length=0,  # its default (1) forbids </s> first; the service does not
        replace_unknowns=False,  # a text-level substitution after decoding; the tokens are compared
    )
    hypotheses = [r.hypotheses[0] for r in results]
    assert not prefix or all(h[:1] == [prefix] for h in hypotheses), "CTranslate2 returns the prefix first"
    return [h[1:] for h in hypotheses] if prefix else hypotheses
