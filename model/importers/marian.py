"""Hugging Face ``MarianMTModel`` interop: opus-mt checkpoints in, our weights out for the peers' benchmarks.

``attnserve import-marian HF_DIR OUT_DIR`` turns a MarianMTModel directory (config.json, weights, source.spm,
target.spm, vocab.json) into a bundle, every OPUS-MT layout: special ids anywhere in the vocabulary, ISO 639-3 codes,
multi-target models (``>>xxx<<`` tokens), weights stored in float16 (:mod:`~model.importers.layout`), checked
against transformers after the import (:mod:`~model.importers.smoke`). ``attnserve export-marian BUNDLE_DIR OUT_DIR``
writes a bundle's weights and tokenizer as a MarianMTModel directory that transformers and CTranslate2's converter
load.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from model.config import TransformerConfig
from model.export.builder.write import write_bundle
from model.importers.layout import Specials, languages, special_ids, stored_dtype
from model.importers.marian_weights import check_tied, read_hf_weights
from service.runtime.manifest import Manifest

log = logging.getLogger(__name__)

# Our names -> Hugging Face's, per layer kind.
ATTENTION = {"W_Q": "q_proj", "W_K": "k_proj", "W_V": "v_proj", "W_O": "out_proj"}
ENCODER_LAYER = {
    "self_attn": "self_attn",
    "feed_forward.w_1": "fc1",
    "feed_forward.w_2": "fc2",
    "sublayer.0.norm": "self_attn_layer_norm",
    "sublayer.1.norm": "final_layer_norm",
}
DECODER_LAYER = {
    "self_attn": "self_attn",
    "src_attn": "encoder_attn",
    "feed_forward.w_1": "fc1",
    "feed_forward.w_2": "fc2",
    "sublayer.0.norm": "self_attn_layer_norm",
    "sublayer.1.norm": "encoder_attn_layer_norm",
    "sublayer.2.norm": "final_layer_norm",
}


def hf_name(name: str) -> str:
    """Our state-dict name -> MarianMTModel's, e.g. ``decoder_layers.1.src_attn.W_K.bias`` ->
    ``model.decoder.layers.1.encoder_attn.k_proj.bias``."""
    if name in ("src_embed.lut.weight", "tgt_embed.lut.weight"):
        return "model.shared.weight"
    if name == "generator.proj.weight":
        return "lm_head.weight"
    if name == "generator.final_logits_bias":
        return "final_logits_bias"
    stack, index, rest = name.split(".", 2)
    side, table = ("encoder", ENCODER_LAYER) if stack == "encoder_layers" else ("decoder", DECODER_LAYER)
    for ours, theirs in table.items():
        if rest.startswith(ours + "."):
            tail = rest[len(ours) + 1 :]
            if "attn" in ours:
                proj, param = tail.split(".")
                tail = f"{ATTENTION[proj]}.{param}"
            return f"model.{side}.layers.{index}.{theirs}.{tail}"
    raise KeyError(f"no MarianMTModel name for {name}")


def config_from_hf(hf: dict[str, Any], specials: Specials) -> TransformerConfig:
    """MarianConfig (config.json) and the vocabulary's special ids -> our config.

    Raises:
        ValueError: a Marian feature our model does not have (separate vocabularies, untied embeddings, ...).
    """
    problems = []
    if hf.get("decoder_vocab_size", hf["vocab_size"]) != hf["vocab_size"]:
        problems.append("separate source and target vocabularies (decoder_vocab_size)")
    if not hf.get("share_encoder_decoder_embeddings", True) or not hf.get("tie_word_embeddings", True):
        problems.append("untied embeddings")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf[a] != hf[b]:
            problems.append(f"{a}={hf[a]} differs from {b}={hf[b]}")
    activation = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}.get(hf["activation_function"])
    if activation is None:
        problems.append(f"activation_function={hf['activation_function']}")
    if hf.get("normalize_before") or hf.get("static_position_embeddings") is False:
        problems.append("pre-LN layers or learned positions")
    if problems:
        raise ValueError("unsupported MarianMTModel: " + "; ".join(problems))
    return TransformerConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["d_model"],
        h=hf["encoder_attention_heads"],
        d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"],
        n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1),
        activation=str(activation),
        max_positions=hf["max_position_embeddings"],
        pad_id=specials.pad_id,
        eos_id=specials.eos_id,
        unk_id=specials.unk_id,
        decoder_start_id=specials.decoder_start_id,
        scale_embedding=hf.get("scale_embedding", True),
        tie_embeddings=True,
        final_logits_bias=True,
        normalize_before=False,
    )


def config_to_hf(c: TransformerConfig) -> dict[str, Any]:
    """Our config -> MarianConfig keyword arguments.

    Raises:
        ValueError: the model cannot be expressed as a MarianMTModel (pre-LN, untied embeddings).
    """
    if c.normalize_before or not c.tie_embeddings:
        raise ValueError("only post-LN models with tied embeddings can be written as a MarianMTModel")
    return {
        "vocab_size": c.vocab_size,
        "decoder_vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.n_encoder_layers,
        "decoder_layers": c.n_decoder_layers,
        "encoder_attention_heads": c.h,
        "decoder_attention_heads": c.h,
        "encoder_ffn_dim": c.d_ff,
        "decoder_ffn_dim": c.d_ff,
        "activation_function": {"swish": "swish", "relu": "relu", "gelu": "gelu"}[c.activation],
        "max_position_embeddings": c.max_positions,
        "pad_token_id": c.pad_id,
        "eos_token_id": c.eos_id,
        "decoder_start_token_id": c.decoder_start_id,
        "forced_eos_token_id": None,  # our decoders do not force </s> at max_length
        "bad_words_ids": [[c.pad_id]],
        "scale_embedding": c.scale_embedding,
        "dropout": c.dropout,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "num_beams": 1,
        "max_length": c.max_positions,
    }


def import_marian(
    hf_dir: Path,
    out_dir: Path,
    *,
    name: str | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    targets: list[str] | None = None,
    store: str = "auto",
    check: bool = True,
    force: bool = False,
) -> Path:
    """Convert a MarianMTModel directory into a bundle (``attnserve import-marian``).

    Args:
        hf_dir: config.json, the weights, source.spm, target.spm, vocab.json (tokenizer_config.json optional).
        out_dir: the bundle directory.
        name: the bundle's name; default ``out_dir``'s.
        source_lang, target_lang: the served codes, instead of those mapped from the model's
            (:mod:`~model.importers.languages`).
        targets: a multi-target model's served targets (served or model codes); default every one.
        store: the weights' stored dtype: ``float16``, ``float32``, or ``auto`` (the checkpoint's).
        check: compare the bundle's greedy output with transformers' (:mod:`~model.importers.smoke`).
        force: replace an existing bundle.

    Raises:
        ValueError: a layout the model cannot hold, codes that name no language, untied weights, or a bundle
            whose output differs from the checkpoint's.
    """
    hf = json.loads((hf_dir / "config.json").read_text())
    vocab = json.loads((hf_dir / "vocab.json").read_text())
    tok_config_path = hf_dir / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text()) if tok_config_path.exists() else {}
    config = config_from_hf(hf, special_ids(hf, vocab, tok_config))
    langs = languages(hf_dir, vocab, tok_config, source_lang=source_lang, target_lang=target_lang, targets=targets)
    float16 = (stored_dtype(hf_dir, hf) if store == "auto" else store) == "float16"
    weights = our_weights(config, read_hf_weights(hf_dir), float16)
    manifest_languages: dict[str, Any] = {"model_languages": langs.to_manifest()}
    if langs.targets:
        manifest_languages["targets"] = [t.to_manifest() for t in langs.targets]
    command = " ".join(["attnserve import-marian", str(hf_dir), str(out_dir)])
    bundle = write_bundle(
        config,
        weights,
        out_dir,
        name=name or out_dir.name,
        source_lang=langs.source,
        target_lang=langs.target,
        languages=manifest_languages,
        float16=float16,
        tokenizer={"source": hf_dir / "source.spm", "target": hf_dir / "target.spm"},
        vocab=vocab,
        provenance={"imported_from": str(hf_dir), "command": command},
        force=force,
    )
    if check and importlib.util.find_spec("transformers") is None:
        log.warning("transformers is not installed: the bundle is not compared with the checkpoint (--no-check)")
    elif check:
        import torch
        from transformers import MarianMTModel

        from model.importers.smoke import check_bundle

        hf_model = MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
        check_bundle(bundle, hf_model, hf_dir)
        log.info("the bundle's greedy output is transformers' on the check sentences")
    return bundle


def our_keys(c: TransformerConfig) -> list[str]:
    """The state-dict keys of a Marian model that the graphs read (tied embeddings: the source embedding's)."""
    keys = ["src_embed.lut.weight", "generator.final_logits_bias"]
    for stack, table, n in (("encoder_layers", ENCODER_LAYER, c.n_encoder_layers),
                            ("decoder_layers", DECODER_LAYER, c.n_decoder_layers)):  # fmt: skip
        for i in range(n):
            for ours in table:
                parts = [f"{ours}.{p}" for p in ATTENTION] if "attn" in ours else [ours]
                keys += [f"{stack}.{i}.{part}.{param}" for part in parts for param in ("weight", "bias")]
    return keys


def our_weights(c: TransformerConfig, hf: dict[str, np.ndarray], float16: bool) -> dict[str, np.ndarray]:
    """MarianMTModel's weights under our names and shapes; rounded through float16 when stored so (exact for a
    checkpoint stored in float16).

    Raises:
        ValueError: untied embeddings (:func:`~model.importers.marian_weights.check_tied`), or a weight missing.
    """
    shared = check_tied(hf)
    state: dict[str, np.ndarray] = {}
    for key in our_keys(c):
        name = hf_name(key)
        if name not in hf and key != "src_embed.lut.weight":
            raise ValueError(f"the checkpoint has no {name}")
        value = shared if key == "src_embed.lut.weight" else hf[name].reshape(-1) if "final_logits" in key else hf[name]
        state[key] = value.astype(np.float16).astype(np.float32) if float16 else value
    return state


def export_marian(bundle_dir: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Write a bundle as a MarianMTModel directory (``attnserve export-marian``): config.json, weights
    (safetensors), source.spm, target.spm, vocab.json and tokenizer_config.json."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel

    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise FileExistsError(f"{out_dir} exists; pass --force to replace it")
    from model.export.weights import load_state_dict

    manifest = Manifest.read(bundle_dir)
    config, state = load_state_dict(bundle_dir)
    hf_model = MarianMTModel(MarianConfig(**config_to_hf(config)))
    hf_state = hf_model.state_dict()
    for key, value in state.items():
        target = hf_name(key)
        hf_state[target] = value.reshape(hf_state[target].shape)
    hf_model.load_state_dict(hf_state)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(out_dir)
    tok = manifest.tokenizer
    shutil.copyfile(bundle_dir / tok["source"], out_dir / "source.spm")
    shutil.copyfile(bundle_dir / tok["target"], out_dir / "target.spm")
    if tok.get("vocab"):
        shutil.copyfile(bundle_dir / tok["vocab"], out_dir / "vocab.json")
    else:  # a joint SentencePiece model whose ids are the model's ids
        sp = spm.SentencePieceProcessor(model_file=str(bundle_dir / tok["source"]))
        vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
        (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n")
    tok_config = {
        "source_lang": manifest.source_lang,
        "target_lang": manifest.target_lang,
        "tokenizer_class": "MarianTokenizer",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": config.max_positions,
        "separate_vocabs": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    log.info("wrote MarianMTModel directory %s", out_dir)
    return out_dir
