"""The device decoder's selection tail: ONNX nodes appended to the exported step (:class:`DeviceDecoderGraph`) that
turn its logits (B, V) into what beam and greedy search read, so that no (B, V) array leaves the device.

``candidates`` (an int64 input of one element, K) picks how many tokens a row keeps. The outputs:

- ``candidate_tokens`` (B, K) int64 and ``candidate_logits`` (B, K) float32: each row's K largest logits, padding
  left out (its logit -inf), best first; ``TopK`` puts the lower token first among equal logits, as the host's
  ranking does (service/runtime/_beam.c), so K = 2k holds every continuation that beam search of width k ranks
  among a request's best 2k;
- ``log_norm`` (B,) float32: log sum exp of the row's logits (the row's largest plus the log of the sum of the
  exponentials of the differences, as _beam.c computes it), so that log p(t) = logit(t) - log_norm;
- ``tokens`` (B,) int64: the greedy token (``ArgMax``: the first of equal logits, as numpy's argmax).

A float16 step's logits are cast to float32 first: scores are read in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model.export.names import SELECTION_OUTPUTS

PREFIX = "selection."  # the tail's node and value names


def append_selection(model: onnx.ModelProto, vocab_size: int, pad_id: int) -> None:
    """Append the selection tail to ``model`` (in place): its ``logits`` output becomes the tail's input, the tail's
    outputs come first, and the ``candidates`` input last."""
    graph = model.graph
    (logits,) = [o for o in graph.output if o.name == "logits"]
    kept = [o for o in graph.output if o.name != "logits"]

    def name(x: str) -> str:
        return PREFIX + x

    def node(op: str, inputs: list[str], outputs: list[str], **attributes: Any) -> onnx.NodeProto:
        return helper.make_node(op, inputs, outputs, name=name(op.lower() + str(len(nodes))), **attributes)

    constants: dict[str, np.ndarray] = {
        "pad": np.array([pad_id], np.int64),
        "depth": np.array(vocab_size, np.int64),
        "values": np.array([0, -np.inf], np.float32),  # OneHot's off and on values: padding gets -inf
        "axis": np.array([1], np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(value, name(key)) for key, value in constants.items())
    nodes: list[onnx.NodeProto] = []
    source = "logits"
    if logits.type.tensor_type.elem_type != TensorProto.FLOAT:
        nodes.append(node("Cast", [source], [name("logits")], to=TensorProto.FLOAT))
        source = name("logits")
    tokens, values, log_norm, greedy = SELECTION_OUTPUTS
    steps: list[tuple[str, list[str], list[str], dict[str, Any]]] = [
        ("OneHot", [name("pad"), name("depth"), name("values")], [name("padding")], {"axis": -1}),  # (1, V)
        ("Add", [source, name("padding")], [name("scores")], {}),  # (B, V)
        ("ReduceMax", [name("scores")], [name("top")], {"axes": [1], "keepdims": 1}),  # (B, 1)
        ("Sub", [name("scores"), name("top")], [name("shifted")], {}),
        ("Exp", [name("shifted")], [name("exp")], {}),
        ("ReduceSum", [name("exp"), name("axis")], [name("sum")], {"keepdims": 0}),  # (B,)
        ("Log", [name("sum")], [name("log_sum")], {}),
        ("Squeeze", [name("top"), name("axis")], [name("largest")], {}),
        ("Add", [name("largest"), name("log_sum")], [log_norm], {}),
        ("TopK", [name("scores"), "candidates"], [values, tokens], {"axis": 1, "largest": 1, "sorted": 1}),
        ("ArgMax", [name("scores")], [greedy], {"axis": 1, "keepdims": 0, "select_last_index": 0}),
    ]
    for op, inputs, outputs, attributes in steps:
        nodes.append(node(op, inputs, outputs, **attributes))
    graph.node.extend(nodes)
    graph.input.append(helper.make_tensor_value_info("candidates", TensorProto.INT64, [1]))
    B = "batch"
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info(tokens, TensorProto.INT64, [B, "candidates"]),
            helper.make_tensor_value_info(values, TensorProto.FLOAT, [B, "candidates"]),
            helper.make_tensor_value_info(log_norm, TensorProto.FLOAT, [B]),
            helper.make_tensor_value_info(greedy, TensorProto.INT64, [B]),
            *kept,
        ]
    )
