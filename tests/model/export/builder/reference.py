"""The PyTorch reference of the builder's graphs: random models of every config the builder takes, and a runner
whose encoder and decoder step are model/transformer.py's (the exact graphs' signatures, appended caches), so that the
service's decoder searches on it exactly as on a bundle's runner."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from model.export.graphs import DecoderGraph, EncoderGraph
from model.transformer import Transformer, TransformerConfig, make_model
from service.runtime.bundle import ModelSpec
from service.runtime.runner import EncoderOutput, StepInput, StepOutput
from tests.service.fake_runner import FakeRunner


def interleaved(max_positions: int, d_model: int) -> torch.Tensor:
    """The paper's sinusoids, sines and cosines interleaved (OpenNMT-py's table), (P, d_model)."""
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]
    angles = position / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_positions, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angles), torch.cos(angles[:, : d_model // 2])
    return pe.float()


# Every config the builder takes: post-LN and pre-LN (+ final LayerNorm), relu/swish/gelu, tied and untied, with and
# without a final logits bias, split (computed) and interleaved sinusoids and a learned table carried as weights,
# scale_embedding, layer_norm_eps, head sizes 8, 6, 5 and 12.
CONFIGS: dict[str, dict[str, Any]] = {
    "post-ln-relu-tied-bias": {"d_model": 32, "h": 4},
    "pre-ln-swish-untied-nobias": {
        "d_model": 32,
        "h": 4,
        "normalize_before": True,
        "activation": "swish",
        "tie_embeddings": False,
        "final_logits_bias": False,
    },
    "gelu-unscaled-eps-dk6": {
        "d_model": 30,
        "h": 5,
        "activation": "gelu",
        "scale_embedding": False,
        "layer_norm_eps": 1e-6,
        "n_encoder_layers": 3,
        "n_decoder_layers": 1,
    },
    "pre-ln-interleaved-table-dk5": {
        "d_model": 20,
        "h": 4,
        "normalize_before": True,
        "position_table": "weights",
        "final_logits_bias": False,
    },
    "learned-table-untied-dk12": {"d_model": 24, "h": 2, "position_table": "weights", "tie_embeddings": False},
}


def random_model(name: str, vocab_size: int = 61, seed: int = 0) -> Transformer:
    """A random model of ``CONFIGS[name]`` whose outputs depend on the input and sometimes end (matrices scaled up
    from their initialization, a random final bias, a random table where the config carries a learned one)."""
    overrides = CONFIGS[name]
    fields = {"n_encoder_layers": 2, "n_decoder_layers": 2, "d_ff": 48, "max_positions": 64,
              "final_logits_bias": True, **overrides}  # fmt: skip
    c = TransformerConfig(vocab_size=vocab_size, pad_id=vocab_size - 1, decoder_start_id=vocab_size - 1, **fields)
    torch.manual_seed(seed)
    model = make_model(c).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(2.0)
            elif p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)  # LayerNorms and biases away from their initial ones and zeros
        if model.generator.final_logits_bias is not None:
            model.generator.final_logits_bias.normal_(0.0, 1.0)
        if c.position_table == "weights":
            for embed in (model.src_embed, model.tgt_embed):  # a learned table: the two sides' differ
                table = torch.randn(c.max_positions, c.d_model) if "learned" in name else interleaved(*embed.pe.shape)
                embed.pe.copy_(table)  # type: ignore[operator]
    return model


class TorchRunner(FakeRunner):
    """The exact runner's encoder and step on model/transformer.py (EncoderGraph, DecoderGraph), in float32."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model.eval()
        self.spec = ModelSpec.from_manifest(model.config.to_dict())
        self.encoder, self.decoder = EncoderGraph(model), DecoderGraph(model)

    @torch.no_grad()
    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        weights, *cross = self.encoder(*(torch.from_numpy(x) for x in (input_ids, attention_mask, position_ids)))
        L = self.model.config.n_decoder_layers
        arrays = [x.numpy() for x in cross]
        return EncoderOutput(weights.numpy(), arrays[:L], arrays[L:])

    @torch.no_grad()
    def step(self, step: StepInput) -> StepOutput:
        assert step.self_attention_mask is not None
        L = self.model.config.n_decoder_layers
        feed = [step.input_ids, step.position_ids, step.encoder_attention_mask, step.self_attention_mask,
                *step.cross_keys, *step.cross_values, *step.past_keys, *step.past_values]  # fmt: skip
        out = [x.numpy() for x in self.decoder(*(torch.from_numpy(np.ascontiguousarray(x)) for x in feed))]
        return StepOutput(out[0], out[1 : 1 + L], out[1 + L : 1 + 2 * L], out[-2], out[-1])
