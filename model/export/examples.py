"""Example feeds for export and for the parity checks: a padded batch with two texts packed in a row, and a
decoder step on a partly masked cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from model.export.graphs import EncoderGraph
from model.export.names import ENCODER_INPUTS
from model.transformer import Transformer, TransformerConfig


def decoder_feed(step: dict[str, np.ndarray], cross: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """A decoder.onnx feed from example_inputs' step (past stacked over layers) and the encoder's cross outputs."""
    L = len(cross) // 2
    feed = {k: v for k, v in step.items() if k not in ("past_keys", "past_values")}
    for l in range(L):
        feed[f"cross_keys.{l}"], feed[f"cross_values.{l}"] = cross[l], cross[L + l]
        feed[f"past_keys.{l}"], feed[f"past_values.{l}"] = step["past_keys"][l], step["past_values"][l]
    return feed


def example_inputs(c: TransformerConfig, B: int = 3, S: int = 7, T: int = 4, seed: int = 0) -> dict[str, Any]:
    """A padded batch of different source lengths, its last row two texts packed (S ≥ 6), and a decoder step with a
    partly masked cache (numpy, int64)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(S, 2, B).astype(np.int64)  # the first sequence is the longest
    lengths[-1] = 5  # the last row: texts of 3 and 2 tokens
    input_ids = rng.integers(2, c.vocab_size - 1, size=(B, S)).astype(np.int64)
    mask = (np.arange(S)[None] < lengths[:, None]).astype(np.int64)
    input_ids = np.where(mask == 1, input_ids, c.pad_id)
    input_ids[np.arange(B), lengths - 1] = c.eos_id
    segments, positions = mask.copy(), np.broadcast_to(np.arange(S), (B, S)).copy()
    segments[-1, 3:5], positions[-1, 3:5], input_ids[-1, 2] = 2, [0, 1], c.eos_id
    self_mask = np.ones((B, T + 1), dtype=np.int64)
    self_mask[1:, : T // 2] = 0  # later sequences joined the batch late: their first cache slots are padding
    L, h, d_k = c.n_decoder_layers, c.h, c.d_k
    return {
        "encoder": {"input_ids": input_ids, "attention_mask": segments, "position_ids": positions},
        "decoder": {
            "input_ids": rng.integers(2, c.vocab_size - 1, size=(B, 1)).astype(np.int64),
            "position_ids": np.full((B, 1), T, dtype=np.int64),
            "encoder_attention_mask": mask,
            "self_attention_mask": self_mask,
            "past_keys": rng.standard_normal((L, B, h, T, d_k)).astype(np.float32),
            "past_values": rng.standard_normal((L, B, h, T, d_k)).astype(np.float32),
        },
    }


def step_example(model: Transformer, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """example_inputs' encoder feed and a decoder feed on the encoder's own cross keys/values (PyTorch's)."""
    ex = example_inputs(model.config, seed=seed)
    with torch.no_grad():
        _, *cross = EncoderGraph(model)(*(torch.from_numpy(ex["encoder"][k]) for k in ENCODER_INPUTS))
    return ex["encoder"], decoder_feed(ex["decoder"], [x.numpy() for x in cross])


def fast_example(
    model: Transformer, seed: int = 0, greedy: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A fast decoder feed (each row's cached tokens at its start, rows of 4, 2 and 0 tokens in caches of 6 slots;
    ``greedy``: every row's logits and greedy token asked for) and the same step as a decoder.onnx feed (each row's
    tokens at the end of a cache of 4, the rest masked)."""
    c = model.config
    _, exact = step_example(model, seed)
    B, h, T, d_k = exact["past_keys.0"].shape
    lengths = np.array([T, T // 2, 0])[:B]
    exact["position_ids"] = lengths[:, None].astype(np.int64)
    exact["self_attention_mask"] = (np.arange(T + 1)[None] >= (T - lengths)[:, None]).astype(np.int64)
    fast = {k: v for k, v in exact.items() if k != "self_attention_mask"}
    if greedy:
        fast["logit_rows"] = fast["token_rows"] = np.arange(B)
    rng = np.random.default_rng(seed)
    for name in (f"past_{kind}.{l}" for kind in ("keys", "values") for l in range(c.n_decoder_layers)):
        buffer = rng.standard_normal((B, h, T + 2, d_k)).astype(np.float32)  # stale slots: never attended to
        for b, n in enumerate(lengths):
            buffer[b, :, :n] = exact[name][b, :, T - n :]
        fast[name] = buffer
    return fast, exact


def forced_example(model: Transformer, seed: int = 0) -> tuple[dict[str, np.ndarray], list[int]]:
    """A decoder.forced.onnx feed on step_example's cross keys and values: rows of targets of T, T - 2 and 1
    tokens (the start id first, padding after), and those lengths."""
    c = model.config
    _, step = step_example(model, seed)
    B, T = len(step["input_ids"]), 6
    lengths = [T, T - 2, 1][:B]
    rng = np.random.default_rng(seed)
    ids = np.full((B, T), c.pad_id, np.int64)
    for b, n in enumerate(lengths):
        ids[b, 0] = c.decoder_start_id
        ids[b, 1:n] = rng.integers(2, c.vocab_size - 1, size=n - 1)
    cross = {k: v for k, v in step.items() if k.startswith("cross_")}
    positions = np.tile(np.arange(T), (B, 1))
    return {"input_ids": ids, "position_ids": positions, "encoder_attention_mask": step["encoder_attention_mask"],
            **cross}, lengths  # fmt: skip


def device_example(model: Transformer, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A device decoder feed (without ``candidates``) and the same step as a decoder.onnx feed: 5 rows on
    step_example's 3 sources (two beams share the first, two the last), whose parents are past rows in another
    order (one parent of two rows), with 4, 4, 2, 0 and 3 tokens generated in past caches of 4 slots (a row owns
    its last ones; the rest are stale)."""
    c = model.config
    _, step = step_example(model, seed)
    L = c.n_decoder_layers
    rng = np.random.default_rng(seed)
    source_rows, parent_rows = np.array([0, 0, 1, 2, 2]), np.array([1, 0, 2, 4, 4])
    lengths = np.array([4, 4, 2, 0, 3])
    N, (_, h, T, d_k) = len(lengths), step["past_keys.0"].shape
    device: dict[str, np.ndarray] = {
        "input_ids": rng.integers(2, c.vocab_size - 1, size=(N, 1)).astype(np.int64),
        "position_ids": lengths[:, None].astype(np.int64),
        "parent_rows": parent_rows,
        "source_rows": source_rows,
        "encoder_attention_mask": step["encoder_attention_mask"],
    }
    exact = {k: device[k] for k in ("input_ids", "position_ids")}
    exact["encoder_attention_mask"] = step["encoder_attention_mask"][source_rows]
    exact["self_attention_mask"] = (np.arange(T + 1)[None] >= (T - lengths)[:, None]).astype(np.int64)
    for kind in ("cross_keys", "cross_values"):
        for l in range(L):
            device[f"{kind}.{l}"] = step[f"{kind}.{l}"]
            exact[f"{kind}.{l}"] = step[f"{kind}.{l}"][source_rows]
    for kind in ("past_keys", "past_values"):
        for l in range(L):
            device[f"{kind}.{l}"] = rng.standard_normal((N, h, T, d_k)).astype(np.float32)
            exact[f"{kind}.{l}"] = device[f"{kind}.{l}"][parent_rows]
    return device, exact
