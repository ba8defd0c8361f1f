"""attnserve's own ONNX Runtime kernels (service/runtime/_attention.c, domain ``attnserve``): the library every session
registers, and the swap of a graph's attention nodes to ONNX Runtime's own ops and back (the quantizer loads only
those)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

KERNELS = "attnserve"  # the domain of attnserve's own ONNX Runtime kernels (service/runtime/_attention.c)
ONNXRUNTIME = {"Attention": "MultiHeadAttention", "CachedAttention": "GroupQueryAttention"}  # com.microsoft's
OURS = {theirs: ours for ours, theirs in ONNXRUNTIME.items()}
Kernels = Literal["attnserve", "onnxruntime"]


def attention_library() -> str:
    """The file of attnserve's attention kernels, ONNX Runtime custom ops (service/runtime/_attention.c) that the fast
    graphs use: ``SessionOptions.register_custom_ops_library`` takes it."""
    from service.runtime import _attention

    return str(_attention.__file__)


def attention_kernels(path: Path, h: int, kernels: Kernels) -> None:
    """:func:`switch_kernels` of the graph at ``path``, written back in place."""
    import onnx

    graph = onnx.load(str(path))
    switch_kernels(graph, h, kernels)
    onnx.save(graph, str(path))


def switch_kernels(graph: Any, h: int, kernels: Kernels) -> None:
    """Whose kernels a graph's (an ``onnx.ModelProto``'s) attention nodes run, in place: attnserve's (domain
    ``attnserve``, service/runtime/_attention.c: ``Attention`` and ``CachedAttention``, as built) or ONNX Runtime's
    (``com.microsoft`` MultiHeadAttention with no bias, GroupQueryAttention with h key/value heads: the form that ONNX
    Runtime's quantizer can load, without attnserve's library). Either form converts to the other; the graph imports
    only the domains its nodes use."""
    import onnx

    for node in graph.graph.node:
        if node.domain == KERNELS and node.op_type in ONNXRUNTIME:
            name = node.op_type
        elif node.domain == "com.microsoft" and node.op_type in OURS:
            name = OURS[node.op_type]
        else:
            continue
        inputs = list(node.input)
        if name == "Attention":  # (q, K, V, mask); MultiHeadAttention's are (q, K, V, bias, mask)
            inputs = [*inputs[:3], inputs[-1]] if kernels == "attnserve" else [*inputs[:3], "", inputs[-1]]
        del node.input[:], node.attribute[:]
        node.input.extend(inputs)  # CachedAttention's are GroupQueryAttention's first seven
        if kernels == "attnserve":
            node.domain, node.op_type = KERNELS, name
        else:
            node.domain, node.op_type = "com.microsoft", ONNXRUNTIME[name]
            heads = ("num_heads", "kv_num_heads") if name == "CachedAttention" else ("num_heads",)
            node.attribute.extend(onnx.helper.make_attribute(a, h) for a in heads)
    used = {node.domain for node in graph.graph.node}
    # ONNX's own domain, and any other that a node uses (ONNX Runtime's optimized graphs import a dozen more)
    others = used - {KERNELS, "com.microsoft"}
    imports = [o for o in graph.opset_import if o.domain in ("", "ai.onnx") or o.domain in others]
    del graph.opset_import[:]
    graph.opset_import.extend(
        [*imports, *(onnx.helper.make_opsetid(d, 1) for d in (KERNELS, "com.microsoft") if d in used)]
    )


def kernel_session(path: Path, optimized: Path | None = None) -> Any:
    """An ONNX Runtime session (CPU) of the graph at ``path`` with attnserve's kernels registered, as the runner makes
    them; ``optimized``: where to write the graph after ONNX Runtime's basic optimizations (weight transposes folded
    into initializers), what the quantizer needs."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.register_custom_ops_library(attention_library())
    if optimized is not None:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
