"""ONNX Runtime sessions of one bundle: token ids in, logits, caches and attention weights out. No HTTP here."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnxruntime as ort

from service.bundle import Bundle

log = logging.getLogger(__name__)

Provider = Literal["auto", "cuda", "cpu"]
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


class ProviderError(RuntimeError):
    """The requested execution provider is not available."""


def choose_provider(requested: Provider) -> str:
    """auto -> CUDA when onnxruntime-gpu sees a GPU, else CPU; cuda without CUDA is an error.

    Raises:
        ProviderError: ``cuda`` was requested and ONNX Runtime has no CUDA execution provider.
    """
    available = ort.get_available_providers()
    if requested == "cuda" and CUDA not in available:
        raise ProviderError(
            f"ATTNSERVE_PROVIDER=cuda but ONNX Runtime offers only {available}: install onnxruntime-gpu "
            "(instead of onnxruntime) on a machine with an NVIDIA GPU, or set ATTNSERVE_PROVIDER=cpu"
        )
    if requested in ("auto", "cuda") and CUDA in available:
        return CUDA
    return CPU


@dataclass(frozen=True)
class EncoderOutput:
    attentions: np.ndarray  # (L_enc, B, h, S, S)
    cross_keys: np.ndarray  # (L_dec, B, h, S, d_k)
    cross_values: np.ndarray


@dataclass(frozen=True)
class StepOutput:
    logits: np.ndarray  # (B, V)
    present_keys: list[np.ndarray]  # per decoder layer (B, h, T + 1, d_k)
    present_values: list[np.ndarray]
    self_attentions: np.ndarray  # (L_dec, B, h, T + 1)
    cross_attentions: np.ndarray  # (L_dec, B, h, S)


class Runner:
    """The encoder and decoder-step sessions of one bundle."""

    def __init__(self, bundle: Bundle, provider: Provider = "auto", threads: int = 1, variant: str = "float32") -> None:
        self.bundle = bundle
        self.variant = variant
        self.spec = bundle.spec
        self.provider = choose_provider(provider)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        # Waiting threads sleep instead of spinning: a spinning pool collapses when another process holds a core.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = [self.provider] if self.provider == CPU else [self.provider, CPU]
        self.encoder = ort.InferenceSession(str(bundle.graph("encoder", variant)), opts, providers=providers)
        self.decoder = ort.InferenceSession(str(bundle.graph("decoder", variant)), opts, providers=providers)
        log.info("bundle %s (%s) on %s (%d intra-op threads)", bundle.name, variant, self.provider, threads)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> EncoderOutput:
        """input_ids, attention_mask (B, S) int64 -> encoder attentions and the decoder's cross keys/values."""
        att, keys, values = self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        return EncoderOutput(att, keys, values)

    def step(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        encoder_attention_mask: np.ndarray,
        self_attention_mask: np.ndarray,
        cross_keys: np.ndarray,
        cross_values: np.ndarray,
        past_keys: list[np.ndarray],
        past_values: list[np.ndarray],
    ) -> StepOutput:
        """One decoding step for B sequences; see docs/ARCHITECTURE.md for the shapes.

        ``cross_keys``/``cross_values`` are the encoder's stacked (L, B, h, S, d_k); ``past_keys``/``past_values``
        one (B, h, T, d_k) array per layer. Arrays should be C-contiguous, or ONNX Runtime copies them.
        """
        feed = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "encoder_attention_mask": encoder_attention_mask,
            "self_attention_mask": self_attention_mask,
        }
        for kind, layers in (
            ("cross_keys", cross_keys),
            ("cross_values", cross_values),
            ("past_keys", past_keys),
            ("past_values", past_values),
        ):
            feed.update({f"{kind}.{l}": layer for l, layer in enumerate(layers)})
        logits, *rest = self.decoder.run(None, feed)
        L = self.spec.n_decoder_layers
        return StepOutput(logits, rest[:L], rest[L : 2 * L], rest[2 * L], rest[2 * L + 1])
