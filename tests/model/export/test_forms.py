"""Tests of model/export/forms.py: every graph of a fresh bundle has a graph_forms entry that agrees with the graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from model.export.quantize import add_float16, add_int8
from service.runtime.manifest import Manifest
from tests.bundles import make_tiny_bundle


def graph_files(graphs: dict[str, Any]) -> set[str]:
    """Every .onnx file the manifest's ``graphs`` names, variants included."""
    files: set[str] = set()
    for value in graphs.values():
        files |= graph_files(value) if isinstance(value, dict) else {value}
    return files


def form_of(path: Path) -> dict[str, str | bool]:
    """A graph's form read off its input and output names (which the service never reads: the manifest tells it)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    inputs = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    outputs = {o.name for o in graph.output}
    if "attention_mask" in inputs:
        return {"role": "encoder", "attentions": "encoder_attentions" in outputs}
    if "past_keys.0" not in inputs:
        return {"role": "forced", "attentions": outputs == {"cross_attentions"}}
    if "parent_rows" in inputs:
        gathered = "source_rows" in inputs and "self_attention_mask" not in inputs
        selection = {"candidate_tokens", "candidate_logits", "log_norm", "tokens"}
        candidates = selection <= outputs and "logits" not in outputs
        return {"role": "decoder", "attentions": False, "cache": "gathered" if gathered else "?",
                "grouped_cross": False, "greedy_tokens": False, "candidates": candidates}  # fmt: skip
    in_place = "self_attention_mask" not in inputs

    def first_axis(name: str) -> str:
        return str(inputs[name][0].dim_param or inputs[name][0].dim_value)

    return {
        "role": "decoder",
        "attentions": "self_attentions" in outputs and "cross_attentions" in outputs,
        "cache": "in_place" if in_place else "appended",
        "grouped_cross": in_place and first_axis("encoder_attention_mask") != first_axis("input_ids"),
        "greedy_tokens": "token_rows" in inputs and "tokens" in outputs,
    }


def test_every_graph_has_a_form_that_agrees_with_it(tmp_path: Path) -> None:
    bundle = make_tiny_bundle(tmp_path / "bundle", tmp_path / "work")
    add_int8(bundle)
    add_float16(bundle)
    manifest = Manifest.read(bundle)
    files = graph_files(manifest.graphs)
    assert files == {
        "encoder.onnx",
        "decoder.onnx",
        "decoder.fast.onnx",
        "decoder.forced.onnx",
        "decoder.device.onnx",
        "encoder.int8.onnx",
        "decoder.int8.onnx",
        "encoder.float16.onnx",
        "decoder.float16.onnx",
        "decoder.device.float16.onnx",
    }
    assert set(manifest.graph_forms) == files
    for name in sorted(files):
        assert manifest.graph_forms[name] == form_of(bundle / name), name
    assert manifest.graph_forms["decoder.fast.onnx"]["greedy_tokens"] is True
    assert manifest.graph_forms["decoder.int8.onnx"]["grouped_cross"] is True
