"""Random models in the layouts real ones come in, written with numpy alone (no torch, no transformers, no
CTranslate2), so that the service-only install imports them as it would a user's: a MarianMTModel directory
(config.json and model.safetensors as transformers' save_pretrained writes them, opus-mt's tokenizer files) and an
Argos package (an OpenNMT-py v3 pre-norm model as CTranslate2's converter writes its model.bin: the variables, flags
and aliases it writes). tests/model/importers holds the importers to transformers and CTranslate2 on the same
layouts, converted by the real converters."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import sentencepiece

from model.importers.ctranslate2 import DTYPES, ModelBin, Variable

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
                     codes: tuple[str, str] = ("en", "ja"), seed: int = 0) -> Path:  # fmt: skip
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
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"source_lang": codes[0], "target_lang": codes[1]}))
    return out_dir


def name_bytes(s: str) -> bytes:
    raw = s.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_model_bin(model: ModelBin) -> bytes:
    """model.bin's bytes as CTranslate2's specs/model_spec.py lays them out."""
    out = (
        struct.pack("<I", model.version)
        + name_bytes(model.spec)
        + struct.pack("<II", model.revision, len(model.variables))
    )
    for v in model.variables.values():
        out += name_bytes(v.name) + struct.pack("<B", len(v.shape)) + struct.pack(f"<{len(v.shape)}I", *v.shape)
        out += struct.pack("<BI", DTYPES.index(v.dtype), len(v.data)) + v.data
    out += struct.pack("<I", len(model.aliases))
    for alias, target in model.aliases.items():
        out += name_bytes(alias) + name_bytes(target)
    return out


def _onmt_positions(max_len: int, d: int) -> np.ndarray:
    """OpenNMT-py's table: sines and cosines interleaved, in float32."""
    position = np.arange(max_len, dtype=np.float32)[:, None]
    div = np.exp(np.arange(0, d, 2, dtype=np.float32) * np.float32(-np.log(10000.0) / d))
    pe = np.zeros((max_len, d), np.float32)
    pe[:, 0::2], pe[:, 1::2] = np.sin(position * div), np.cos(position * div)
    return pe


def argos_package(folder: Path, spm: Path, source: str, target: str, *, d: int = 32, heads: int = 4, d_ff: int = 64,
                  layers: int = 2, seed: int = 0) -> Path:  # fmt: skip
    """An Argos package folder of a random pre-norm OpenNMT-py model (ReLU, shared embeddings and projection, a
    final LayerNorm a stack), float32, as CTranslate2's OpenNMTPyConverter writes it."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    specials = ["<unk>", "<blank>", "<s>", "</s>"]
    vocab = specials + [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size())) if p not in specials]
    rng = np.random.default_rng(seed)
    variables: dict[str, np.ndarray] = {}

    def linear(name: str, rows: int, cols: int) -> None:
        variables[f"{name}/weight"] = 0.3 * rng.standard_normal((rows, cols), np.float32)
        variables[f"{name}/bias"] = 0.1 * rng.standard_normal(rows, np.float32)

    def norm(name: str) -> None:
        variables[f"{name}/gamma"] = 1 + 0.1 * rng.standard_normal(d, np.float32)
        variables[f"{name}/beta"] = 0.1 * rng.standard_normal(d, np.float32)

    for stack in ("encoder", "decoder"):
        for i in range(layers):
            s = f"{stack}/layer_{i}"
            linear(f"{s}/self_attention/linear_0", 3 * d, d)
            linear(f"{s}/self_attention/linear_1", d, d)
            norm(f"{s}/self_attention/layer_norm")
            if stack == "decoder":
                linear(f"{s}/attention/linear_0", d, d)
                linear(f"{s}/attention/linear_1", 2 * d, d)
                linear(f"{s}/attention/linear_2", d, d)
                norm(f"{s}/attention/layer_norm")
            linear(f"{s}/ffn/linear_0", d_ff, d)
            linear(f"{s}/ffn/linear_1", d, d_ff)
            norm(f"{s}/ffn/layer_norm")
        norm(f"{stack}/layer_norm")
    variables["decoder/embeddings/weight"] = 0.3 * rng.standard_normal((len(vocab), d), np.float32)
    variables["decoder/projection/bias"] = rng.standard_normal(len(vocab), np.float32)
    variables["decoder/position_encodings/encodings"] = _onmt_positions(128, d)
    flags = {"activation": np.int8(0), "alibi": np.int8(0), "alibi_use_positive_positions": np.int8(0),
             "alignment_heads": np.int16(1), "alignment_layer": np.int16(-1), "num_heads": np.int16(heads),
             "pre_norm": np.int8(1), "scale_alibi": np.int8(0), "scale_embeddings": np.int8(1),
             "start_from_zero_embedding": np.int8(0)}  # fmt: skip
    variables |= {f"decoder/{k}": np.array(v) for k, v in flags.items()}
    encoder_flags = {"activation": np.int8(0), "embeddings_merge": np.int8(0), "multi_query_attention": np.int8(0),
                     "num_heads": np.int16(heads), "pre_norm": np.int8(1), "scale_embeddings": np.int8(1)}  # fmt: skip
    variables |= {f"encoder/{k}": np.array(v) for k, v in encoder_flags.items()}
    model = ModelBin(
        version=6, spec="TransformerSpec", revision=7,
        variables={k: Variable(k, v.shape, str(v.dtype), v.tobytes()) for k, v in sorted(variables.items())},
        aliases={"decoder/projection/weight": "decoder/embeddings/weight",
                 "encoder/embeddings_0/weight": "decoder/embeddings/weight",
                 "encoder/position_encodings/encodings": "decoder/position_encodings/encodings"},
    )  # fmt: skip
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "model.bin").write_bytes(write_model_bin(model))
    config = {"add_source_bos": False, "add_source_eos": False, "bos_token": "<s>", "decoder_start_token": "<s>",
              "eos_token": "</s>", "layer_norm_epsilon": None, "multi_query_attention": False,
              "unk_token": "<unk>"}  # fmt: skip
    (folder / "model" / "config.json").write_text(json.dumps(config))
    (folder / "model" / "shared_vocabulary.json").write_text(json.dumps(vocab, ensure_ascii=False))
    meta = {"package_version": "1.0", "type": "translate", "from_code": source, "to_code": target}
    (folder / "metadata.json").write_text(json.dumps(meta))
    shutil.copyfile(spm, folder / "sentencepiece.model")
    return folder
