"""The graphs' input and output names and dynamic axes, in the graph modules' order (docs/ARCHITECTURE.md)."""

from __future__ import annotations

SOURCES = "sources"  # the fast decoder's cross caches' and encoder mask's first axis: B / G sources of G rows each


ENCODER_INPUTS = ["input_ids", "attention_mask", "position_ids"]


def encoder_outputs(L: int, fast: bool = False) -> list[str]:
    """encoder.onnx's (``fast``: :class:`FastEncoderGraph`'s, without attentions) output names for L decoder layers,
    in the graph module's order."""
    cross = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values") for l in range(L)]
    return cross if fast else ["encoder_attentions", *cross]


def encoder_axes(L: int) -> dict[str, dict[int, str]]:
    B, S = "batch", "source_length"
    return {
        **{name: {0: B, 1: S} for name in ENCODER_INPUTS},
        "encoder_attentions": {1: B, 3: S, 4: S},
        **{f"cross_{kind}.{l}": {0: B, 2: S} for kind in ("keys", "values") for l in range(L)},
    }


def decoder_inputs(L: int, fast: bool = False, greedy: bool = False) -> list[str]:
    """decoder.onnx's (or the fast decoder's: no self-attention mask; ``greedy``, the rows of logits and of tokens)
    input names for L layers, in the graph module's order."""
    cache = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values", "past_keys", "past_values") for l in range(L)]
    rows = ["logit_rows", "token_rows"] if greedy else [] if fast else ["self_attention_mask"]
    return ["input_ids", "position_ids", "encoder_attention_mask", *rows, *cache]


def decoder_outputs(L: int, fast: bool = False, greedy: bool = False) -> list[str]:
    """decoder.onnx's (or decoder.fast.onnx's, ``greedy``: with tokens) output names for L layers, in the graph
    module's order."""
    present = [f"{kind}.{l}" for kind in ("present_keys", "present_values") for l in range(L)]
    if fast:
        return ["logits", *(["tokens"] if greedy else []), *present]
    return ["logits", *present, "self_attentions", "cross_attentions"]


def step_axes(L: int) -> dict[str, dict[int, str]]:
    B, S, T, total = "batch", "source_length", "past_length", "total_length"
    return {
        "input_ids": {0: B},
        "position_ids": {0: B},
        "encoder_attention_mask": {0: B, 1: S},
        "self_attention_mask": {0: B, 1: total},
        **{f"cross_{kind}.{l}": {0: B, 2: S} for kind in ("keys", "values") for l in range(L)},
        **{f"past_{kind}.{l}": {0: B, 2: T} for kind in ("keys", "values") for l in range(L)},
        "logits": {0: B},
        **{f"present_{kind}.{l}": {0: B, 2: total} for kind in ("keys", "values") for l in range(L)},
    }


def fast_decoder_axes(L: int, greedy: bool) -> dict[str, dict[int, str]]:
    """The fast decoder's dynamic axes: the step's, with the cross keys, values and encoder mask over sources (B / G
    sources of G rows each), caches of any capacity, and (``greedy``) the rows of logits and of tokens."""
    axes = {k: v for k, v in step_axes(L).items() if k != "self_attention_mask"}
    for name in ("encoder_attention_mask", *(f"cross_{kind}.{l}" for kind in ("keys", "values") for l in range(L))):
        axes[name] = {**axes[name], 0: SOURCES}  # B / G sources, G rows each (docs/ARCHITECTURE.md)
    axes.update({f"{kind}.{l}": {0: "batch", 2: "capacity"} for kind in ("past_keys", "past_values", "present_keys",
                 "present_values") for l in range(L)})  # fmt: skip
    if greedy:
        axes.update({"logit_rows": {0: "logit_rows"}, "logits": {0: "logit_rows"}, "token_rows": {0: "token_rows"},
                     "tokens": {0: "token_rows"}})  # fmt: skip
    return axes


def forced_inputs(L: int) -> list[str]:
    """decoder.forced.onnx's input names for L layers, in the graph module's order: every layer's cross keys, the
    cross values of all but the last (whose values reach no cross-attention weight)."""
    cross = [*(f"cross_keys.{l}" for l in range(L)), *(f"cross_values.{l}" for l in range(L - 1))]
    return ["input_ids", "position_ids", "encoder_attention_mask", *cross]


FORCED_OUTPUTS = ["cross_attentions"]


def forced_axes(L: int) -> dict[str, dict[int, str]]:
    """decoder.forced.onnx's dynamic axes: rows, the target's length and the source's."""
    B, S, T = "batch", "source_length", "target_length"
    return {
        "input_ids": {0: B, 1: T},
        "position_ids": {0: B, 1: T},
        "encoder_attention_mask": {0: B, 1: S},
        **{name: {0: B, 2: S} for name in forced_inputs(L)[3:]},
        "cross_attentions": {1: B, 3: T, 4: S},
    }


def device_decoder_inputs(L: int, selection: bool = True) -> list[str]:
    """decoder.device.onnx's input names for L layers, in the graph module's order (``selection``: with the
    ``candidates`` count that the selection tail takes, :mod:`~model.export.selection`)."""
    cache = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values", "past_keys", "past_values") for l in range(L)]
    rows = ["input_ids", "position_ids", "parent_rows", "source_rows", "encoder_attention_mask"]
    return [*rows, *cache, *(["candidates"] if selection else [])]


SELECTION_OUTPUTS = ["candidate_tokens", "candidate_logits", "log_norm", "tokens"]


def device_decoder_outputs(L: int, selection: bool = True) -> list[str]:
    """decoder.device.onnx's output names for L layers (``selection``: the selection tail's, else the step's
    ``logits`` that it reads)."""
    present = [f"{kind}.{l}" for kind in ("present_keys", "present_values") for l in range(L)]
    return [*(SELECTION_OUTPUTS if selection else ["logits"]), *present]


def device_decoder_axes(L: int) -> dict[str, dict[int, str]]:
    """The device decoder step's dynamic axes: rows, the sources their cross caches come from, the past caches'
    rows (gathered by ``parent_rows``) and length."""
    B, J, S, P, T = "batch", SOURCES, "source_length", "past_rows", "past_length"
    return {
        **{name: {0: B} for name in ("input_ids", "position_ids", "parent_rows", "source_rows", "logits")},
        "encoder_attention_mask": {0: J, 1: S},
        **{f"cross_{kind}.{l}": {0: J, 2: S} for kind in ("keys", "values") for l in range(L)},
        **{f"past_{kind}.{l}": {0: P, 2: T} for kind in ("keys", "values") for l in range(L)},
        **{f"present_{kind}.{l}": {0: B, 2: "total_length"} for kind in ("keys", "values") for l in range(L)},
    }
