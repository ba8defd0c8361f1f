"""Each graph's form, as the manifest's ``graph_forms`` states it (docs/ARCHITECTURE.md): the service's
:class:`service.runtime.bundle.GraphForm`, written by the exporter from what it builds, never read back from the
graphs."""

from __future__ import annotations

from service.runtime.bundle import GraphForm

EXACT_ENCODER = GraphForm("encoder", attentions=True)  # EncoderGraph: encoder.onnx and its float16 variant
EXACT_DECODER = GraphForm("decoder", attentions=True, cache="appended")  # decoder.onnx and its float16 variant
FORCED_DECODER = GraphForm("forced", attentions=True)  # ForcedDecoderGraph: decoder.forced.onnx
# DeviceDecoderGraph and its selection tail: decoder.device.onnx and the float16 variant's decoder.device.float16.onnx
DEVICE_DECODER = GraphForm("decoder", attentions=False, cache="gathered", candidates=True)


def fast_decoder_form(*, greedy: bool) -> GraphForm:
    """FastDecoderGraph's form: decoder.fast.onnx (``greedy``) and what decoder.int8.onnx is quantized from."""
    return GraphForm("decoder", attentions=False, cache="in_place", grouped_cross=True, greedy_tokens=greedy)
