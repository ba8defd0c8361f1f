"""A CTranslate2 ``TransformerSpec`` (a parsed model.bin) mapped onto our Transformer, exactly, or refused.

Every variable of the file is either mapped or named in the refusal, so a feature our model lacks (relative
positions, rotary embeddings, ALiBi, multi-query attention, gated FFNs, RMSNorm, source features) never passes
silently. Weights come out as CTranslate2 computes with them under ``compute_type="float32"``
(:meth:`~model.importers.ctranslate2.ModelBin.float32`).

The vocabulary gains one id at its end, ``<pad>``: our service never emits the pad id and pads with it, and no
CTranslate2 token is lost to it. Its embedding row is zero, so a decoder that starts from a zero embedding
(``decoder/start_from_zero_embedding``, OPUS-MT) starts from it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.config import TransformerConfig
from model.importers.ctranslate2 import ModelBin, ModelBinError

SPEC = "TransformerSpec"
MAX_REVISION = 7
ACTIVATIONS = {0: "relu", 2: "swish", 3: "gelu"}  # common_spec.Activation ids our model has
FEATURES = {  # a variable name's part -> the feature it means, for the refusal
    "relative_position": "relative positions",
    "relative_attention": "relative attention bias",
    "relative_asymmetric": "relative positions",
    "rotary": "rotary embeddings",
    "alibi": "ALiBi",
    "num_heads_kv": "multi-query attention",
    "linear_0_noact": "a gated feed-forward network (GLU)",
    "layernorm_embedding": "a LayerNorm on the embeddings",
    "project_in": "projections around the decoder",
    "project_out": "projections around the decoder",
    "embeddings_1": "source features (several source embeddings)",
    "q_norm": "query/key normalization",
    "k_norm": "query/key normalization",
    "scale_outputs": "scaled decoder outputs",
    "final_logit_softcapping": "logit soft-capping",
    "sliding_window": "a sliding attention window",
    "queries_scale": "a query scale",
    "layer_norm_use_residual": "RMSNorm",
    "input_layer_norm": "pre- and post-norm layers",
    "layer_scalar": "layer scalars",
}
FLAGS_AT = {  # flags that must have these values, and the feature a different value means
    "encoder/multi_query_attention": (0.0, "multi-query attention"),
    "decoder/alibi": (0.0, "ALiBi"),
}
IGNORED = re.compile(r"(encoder|decoder)/(alignment_layer|alignment_heads|embeddings_merge|alibi_use_positive_positions"
                     r"|scale_alibi)$")  # fmt: skip


class UnsupportedModel(ValueError):
    """The model has a feature our Transformer cannot compute exactly; the message names it."""


@dataclass(frozen=True)
class Mapped:
    """What the model.bin becomes: our config (less the vocabulary ids) and the weights by our state-dict name."""

    config: dict[str, Any]
    state: dict[str, np.ndarray]
    vocab_size: int  # CTranslate2's (ours is one more: the pad id)


class _Reader:
    """Takes variables from a model.bin, checks their shapes, and remembers which it took."""

    def __init__(self, model: ModelBin) -> None:
        self.model, self.used = model, set[str]()

    def has(self, name: str) -> bool:
        return name in self.model.names()

    def flag(self, name: str, default: float | None = None) -> float:
        self.used.add(name)
        return self.model.scalar(name, default)

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        self.used |= {name, name + "_scale"}
        value = self.model.float32(name)
        if value.shape != shape:
            raise ModelBinError(f"model.bin: {name} has shape {list(value.shape)}, the spec needs {list(shape)}")
        return value

    def optional(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A bias CTranslate2 may leave out (then zero, which adds nothing)."""
        return self.take(name, shape) if self.has(name) else np.zeros(shape, np.float32)

    def left_over(self) -> list[str]:
        scales = {n + "_scale" for n in self.used}
        return sorted(n for n in self.model.names() if n not in self.used | scales and not IGNORED.match(n))


def refuse_features(model: ModelBin) -> None:
    """Raise :class:`UnsupportedModel` for the first variable or flag that means a feature our model lacks."""
    if model.spec != SPEC:
        raise UnsupportedModel(f"model.bin holds a {model.spec}; only {SPEC} (an encoder-decoder) is imported")
    if model.revision > MAX_REVISION:
        raise UnsupportedModel(f"model.bin spec revision {model.revision} is newer than this importer ({MAX_REVISION})")
    for name in sorted(n for n in model.names() if n not in FLAGS_AT and not IGNORED.match(n)):
        for part, feature in FEATURES.items():
            if part in name:
                raise UnsupportedModel(f"model.bin uses {feature} ({name}), which attnserve's Transformer lacks")
    for name, (value, feature) in FLAGS_AT.items():
        if model.scalar(name, value) != value:
            raise UnsupportedModel(f"model.bin uses {feature} ({name}), which attnserve's Transformer lacks")


def _count(model: ModelBin, stack: str) -> int:
    indices = {int(m.group(1)) for n in model.names() if (m := re.match(rf"{stack}/layer_(\d+)/", n))}
    if indices != set(range(len(indices))) or not indices:
        raise ModelBinError(f"model.bin: the {stack} layers are {sorted(indices)}, expected 0, 1, ...")
    return len(indices)


def _linear(r: _Reader, scope: str, ours: list[str], d_in: int, d_out: int) -> dict[str, np.ndarray]:
    """A CTranslate2 linear layer (fused projections stacked by rows) split into ours, (d_out, d_in) each."""
    n = len(ours)
    W = r.take(f"{scope}/weight", (n * d_out, d_in))
    b = r.optional(f"{scope}/bias", (n * d_out,))
    out = {}
    for i, name in enumerate(ours):
        out[f"{name}.weight"], out[f"{name}.bias"] = W[i * d_out : (i + 1) * d_out], b[i * d_out : (i + 1) * d_out]
    return out


def _norm(r: _Reader, scope: str, ours: str, d: int) -> dict[str, np.ndarray]:
    if not r.has(f"{scope}/beta"):
        raise UnsupportedModel(f"model.bin uses RMSNorm ({scope} has no beta), which attnserve's Transformer lacks")
    return {f"{ours}.weight": r.take(f"{scope}/gamma", (d,)), f"{ours}.bias": r.take(f"{scope}/beta", (d,))}


def _encoder_layer(r: _Reader, i: int, d: int, d_ff: int) -> dict[str, np.ndarray]:
    s, o = f"encoder/layer_{i}", f"encoder_layers.{i}"
    return {
        **_linear(r, f"{s}/self_attention/linear_0", [f"{o}.self_attn.W_{x}" for x in "QKV"], d, d),
        **_linear(r, f"{s}/self_attention/linear_1", [f"{o}.self_attn.W_O"], d, d),
        **_norm(r, f"{s}/self_attention/layer_norm", f"{o}.sublayer.0.norm", d),
        **_linear(r, f"{s}/ffn/linear_0", [f"{o}.feed_forward.w_1"], d, d_ff),
        **_linear(r, f"{s}/ffn/linear_1", [f"{o}.feed_forward.w_2"], d_ff, d),
        **_norm(r, f"{s}/ffn/layer_norm", f"{o}.sublayer.1.norm", d),
    }


def _decoder_layer(r: _Reader, i: int, d: int, d_ff: int) -> dict[str, np.ndarray]:
    s, o = f"decoder/layer_{i}", f"decoder_layers.{i}"
    return {
        **_linear(r, f"{s}/self_attention/linear_0", [f"{o}.self_attn.W_{x}" for x in "QKV"], d, d),
        **_linear(r, f"{s}/self_attention/linear_1", [f"{o}.self_attn.W_O"], d, d),
        **_norm(r, f"{s}/self_attention/layer_norm", f"{o}.sublayer.0.norm", d),
        **_linear(r, f"{s}/attention/linear_0", [f"{o}.src_attn.W_Q"], d, d),
        **_linear(r, f"{s}/attention/linear_1", [f"{o}.src_attn.W_K", f"{o}.src_attn.W_V"], d, d),
        **_linear(r, f"{s}/attention/linear_2", [f"{o}.src_attn.W_O"], d, d),
        **_norm(r, f"{s}/attention/layer_norm", f"{o}.sublayer.1.norm", d),
        **_linear(r, f"{s}/ffn/linear_0", [f"{o}.feed_forward.w_1"], d, d_ff),
        **_linear(r, f"{s}/ffn/linear_1", [f"{o}.feed_forward.w_2"], d_ff, d),
        **_norm(r, f"{s}/ffn/layer_norm", f"{o}.sublayer.2.norm", d),
    }


def _same(r: _Reader, names: tuple[str, str]) -> float:
    a, b = (r.flag(n) for n in names)
    if a != b:
        raise UnsupportedModel(f"model.bin: {names[0]}={a:g} but {names[1]}={b:g}; attnserve needs them equal")
    return a


def _scale_embedding(r: _Reader, d: int) -> bool:
    """Whether embeddings are multiplied by √d_model (a flag, or a factor that must be √d_model or 1)."""
    scales = []
    for stack in ("encoder", "decoder"):
        name = f"{stack}/scale_embeddings"
        var = r.model.get(name) if r.has(name) else None
        value = r.flag(name, 1.0)
        if var is not None and var.dtype != "int8" and value not in (1.0, float(np.float32(math.sqrt(d)))):
            raise UnsupportedModel(f"model.bin: {name}={value:g}; attnserve scales embeddings by √d_model or not")
        scales.append(value != 0.0 if var is None or var.dtype == "int8" else value != 1.0)
    if scales[0] != scales[1]:
        raise UnsupportedModel("model.bin scales the encoder's and the decoder's embeddings differently")
    return scales[0]


def _pad(table: np.ndarray) -> np.ndarray:
    """One zero row (or entry) more at the end: the pad id's."""
    return np.concatenate([table, np.zeros((1, *table.shape[1:]), np.float32)])


def _embeddings(r: _Reader, d: int) -> tuple[dict[str, np.ndarray], int, int]:
    """The embeddings, generator and position tables; returns them, CTranslate2's vocabulary size and the positions."""
    V = r.model.get("decoder/embeddings/weight").shape[0]
    src = r.take("encoder/embeddings_0/weight", (V, d))
    tgt = r.take("decoder/embeddings/weight", (V, d))
    proj = r.take("decoder/projection/weight", (V, d))
    bias = r.optional("decoder/projection/bias", (V,))
    tables = []
    for stack in ("encoder", "decoder"):
        name = f"{stack}/position_encodings/encodings"
        if not r.has(name):
            raise UnsupportedModel(f"model.bin has no {name}: run-time sinusoids are not imported")
        tables.append(r.take(name, (r.model.get(name).shape[0], d)))
    if tables[0].shape != tables[1].shape:
        raise UnsupportedModel("model.bin: the encoder's and the decoder's position tables differ in length")
    state = {
        "src_embed.lut.weight": _pad(src),
        "tgt_embed.lut.weight": _pad(tgt),
        "generator.proj.weight": _pad(proj),
        "generator.final_logits_bias": _pad(bias),
        "src_embed.pe": tables[0],
        "tgt_embed.pe": tables[1],
    }
    return state, V, tables[0].shape[0]


def map_transformer(model: ModelBin, layer_norm_eps: float) -> Mapped:
    """Map a TransformerSpec onto our model.

    Args:
        model: the parsed model.bin.
        layer_norm_eps: the epsilon CTranslate2 applies (config.json's ``layer_norm_epsilon``, else 1e-5).

    Raises:
        UnsupportedModel: a feature our model lacks, named.
        ModelBinError: a variable whose shape disagrees with the spec, or a flag of the wrong kind.
    """
    refuse_features(model)
    r = _Reader(model)
    r.used |= set(FLAGS_AT)  # checked by refuse_features
    h = int(_same(r, ("encoder/num_heads", "decoder/num_heads")))
    pre_norm = bool(_same(r, ("encoder/pre_norm", "decoder/pre_norm")))
    activation = int(_same(r, ("encoder/activation", "decoder/activation")))
    if activation not in ACTIVATIONS:
        raise UnsupportedModel(f"model.bin: activation id {activation}; attnserve has ReLU, Swish and GELU")
    d = model.get("decoder/embeddings/weight").shape[-1]
    d_ff = model.get("encoder/layer_0/ffn/linear_0/weight").shape[0]
    if h <= 0 or d % h:
        raise ModelBinError(f"model.bin: d_model {d} is not divisible by {h} heads")
    n_enc, n_dec = _count(model, "encoder"), _count(model, "decoder")
    state, V, positions = _embeddings(r, d)
    for i in range(n_enc):
        state |= _encoder_layer(r, i, d, d_ff)
    for i in range(n_dec):
        state |= _decoder_layer(r, i, d, d_ff)
    if pre_norm:
        for stack in ("encoder", "decoder"):
            if not r.has(f"{stack}/layer_norm/gamma"):
                raise UnsupportedModel(f"model.bin: a pre-norm {stack} without its final LayerNorm")
            state |= _norm(r, f"{stack}/layer_norm", f"{stack}_norm", d)
    zero_start = bool(r.flag("decoder/start_from_zero_embedding", 0.0))
    config = {
        "d_model": d,
        "h": h,
        "d_ff": d_ff,
        "n_encoder_layers": n_enc,
        "n_decoder_layers": n_dec,
        "dropout": 0.0,
        "activation": ACTIVATIONS[activation],
        "max_positions": positions,
        "scale_embedding": _scale_embedding(r, d),
        "tie_embeddings": all(
            np.array_equal(state["src_embed.lut.weight"], state[k])
            for k in ("tgt_embed.lut.weight", "generator.proj.weight")
        ),
        "final_logits_bias": True,
        "normalize_before": pre_norm,
        "layer_norm_eps": layer_norm_eps,
        "position_table": "weights",
        "start_from_zero_embedding": zero_start,
    }
    if left := r.left_over():
        raise UnsupportedModel(f"model.bin has variables attnserve does not map: {', '.join(left[:3])}")
    return Mapped(config, state, V)


def transformer_config(mapped: Mapped, ids: dict[str, int]) -> TransformerConfig:
    """Our config from a mapping and the special ids (``eos_id``, ``unk_id``, ``decoder_start_id``; the pad id is
    the extra one at the end, and the start id too when the decoder starts from a zero embedding)."""
    c = dict(mapped.config)
    pad = mapped.vocab_size
    start = pad if c.pop("start_from_zero_embedding") else ids["decoder_start_id"]
    return TransformerConfig(
        vocab_size=pad + 1, pad_id=pad, eos_id=ids["eos_id"], unk_id=ids["unk_id"], decoder_start_id=start, **c
    )
