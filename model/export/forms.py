"""Each graph's form, as the manifest's ``graph_forms`` states it (docs/ARCHITECTURE.md): what the service needs to
know about a graph (its role, attention outputs, cache layout, grouped cross keys, greedy tokens) without reading
its input and output names."""

from __future__ import annotations

from typing import Any, Literal

GraphForm = dict[str, str | bool]
Cache = Literal["appended", "in_place"]


def encoder_form(*, attentions: bool) -> GraphForm:
    """An encoder graph's form; ``attentions``: it outputs ``encoder_attentions``."""
    return {"role": "encoder", "attentions": attentions}


def decoder_form(*, attentions: bool, cache: Cache, grouped_cross: bool, greedy_tokens: bool) -> GraphForm:
    """A decoder step graph's form.

    Args:
        attentions: it outputs ``self_attentions`` and ``cross_attentions``.
        cache: ``"appended"``: past caches in, presents one slot longer out, and a ``self_attention_mask`` input;
            ``"in_place"``: no mask, each row's tokens at the start of cache buffers written in place.
        grouped_cross: the cross keys' and values' first axis is named apart from the rows' (one source may serve
            G consecutive rows).
        greedy_tokens: it has ``logit_rows``/``token_rows`` inputs and a ``tokens`` output.
    """
    return {
        "role": "decoder",
        "attentions": attentions,
        "cache": cache,
        "grouped_cross": grouped_cross,
        "greedy_tokens": greedy_tokens,
    }


EXACT_ENCODER = encoder_form(attentions=True)  # EncoderGraph: encoder.onnx and its float16 variant
FAST_ENCODER = encoder_form(attentions=False)  # FastEncoderGraph, what encoder.int8.onnx is quantized from
EXACT_DECODER = decoder_form(attentions=True, cache="appended", grouped_cross=False, greedy_tokens=False)


def fast_decoder_form(*, greedy: bool) -> GraphForm:
    """FastDecoderGraph's form: decoder.fast.onnx (``greedy``) and what decoder.int8.onnx is quantized from."""
    return decoder_form(attentions=False, cache="in_place", grouped_cross=True, greedy_tokens=greedy)


def with_graph_forms(manifest: dict[str, Any], forms: dict[str, GraphForm]) -> dict[str, Any]:
    """``manifest`` with ``forms`` (graph file name -> form) added to its ``graph_forms``."""
    return {**manifest, "graph_forms": {**manifest.get("graph_forms", {}), **forms}}
