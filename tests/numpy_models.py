"""Random models in the layouts real ones come in, written with numpy alone (no torch, no transformers, no
CTranslate2), so that the service-only install imports them as it would a user's: a MarianMTModel directory
(config.json and model.safetensors as transformers' save_pretrained writes them, opus-mt's tokenizer files).
tests/model/importers holds the importers to transformers and CTranslate2 on the same layouts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import sentencepiece

MARIAN_LAYER = {  # MarianMTModel's names in one layer: modules and their (rows, columns) in d_model (d) and d_ff (f)
    "encoder": ("self_attn", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm"),
    "decoder": ("self_attn", "self_attn_layer_norm", "encoder_attn", "encoder_attn_layer_norm", "fc1", "fc2",
                "final_layer_norm"),
}  # fmt: skip


def marian_vocabulary(spm: Path, size: int | None = None) -> dict[str, int]:
    """opus-mt's vocabulary of a SentencePiece model: its pieces (</s> 0, <unk> 1), made-up pieces up to ``size``,
    ``<pad>`` last."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    pieces = [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size())) if p != "<pad>"]
    pieces += [f"▁made{i}" for i in range((size or 0) - len(pieces) - 1)]
    return {p: i for i, p in enumerate([*pieces, "<pad>"])}


def marian_directory(out_dir: Path, spm: Path, *, d_model: int = 32, heads: int = 4, d_ff: int = 64,
                     layers: tuple[int, int] = (2, 2), vocab_size: int | None = None, positions: int = 64,
                     seed: int = 0) -> Path:  # fmt: skip
    """A random MarianMTModel directory (swish, tied embeddings, a final logits bias, the pad row zero) of these
    sizes, its weights scaled so that outputs depend on the input at any width."""
    vocab = marian_vocabulary(spm, vocab_size)
    V, pad = len(vocab), vocab["<pad>"]
    rng = np.random.default_rng(seed)
    scale = 0.3 * (32 / d_model) ** 0.5
    shapes = {"fc1": (d_ff, d_model), "fc2": (d_model, d_ff)}
    tensors: dict[str, np.ndarray] = {}
    for side, n in zip(("encoder", "decoder"), layers, strict=True):
        for i in range(n):
            for module in MARIAN_LAYER[side]:
                name = f"model.{side}.layers.{i}.{module}"
                if module.endswith("layer_norm"):
                    tensors[f"{name}.weight"] = 1 + 0.1 * rng.standard_normal(d_model, np.float32)
                    tensors[f"{name}.bias"] = 0.1 * rng.standard_normal(d_model, np.float32)
                    continue
                parts = [f"{name}.{p}_proj" for p in ("q", "k", "v", "out")] if "attn" in module else [name]
                for part in parts:
                    rows, cols = shapes.get(module, (d_model, d_model))
                    tensors[f"{part}.weight"] = scale * rng.standard_normal((rows, cols), np.float32)
                    tensors[f"{part}.bias"] = 0.1 * rng.standard_normal(rows, np.float32)
    shared = scale * rng.standard_normal((V, d_model), np.float32)
    shared[pad] = 0
    tensors["model.shared.weight"] = shared
    tensors["final_logits_bias"] = rng.standard_normal((1, V), np.float32)
    out_dir.mkdir(parents=True)
    from safetensors.numpy import save_file

    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["MarianMTModel"], "model_type": "marian", "activation_function": "swish",
        "d_model": d_model, "encoder_layers": layers[0], "decoder_layers": layers[1],
        "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": d_ff,
        "decoder_ffn_dim": d_ff, "max_position_embeddings": positions, "vocab_size": V, "decoder_vocab_size": V,
        "pad_token_id": pad, "eos_token_id": vocab["</s>"], "decoder_start_token_id": pad, "scale_embedding": False,
        "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "dropout": 0.1, "dtype": "float32",
    }  # fmt: skip
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for role in ("source", "target"):
        shutil.copyfile(spm, out_dir / f"{role}.spm")
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "ja"}))
    return out_dir
