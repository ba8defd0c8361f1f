"""Write a bundle: the model as ONNX graphs (an encoder and a decoder step with every attention as an output, and
a fast encoder and decoder step for /translate), its tokenizer and a manifest.

The bundle layout and graph signatures are the contract in docs/ARCHITECTURE.md. Exporting checks ONNX Runtime
against PyTorch before anything is written, and refuses to overwrite a bundle without ``force``.

The weights travel inside the graphs: ONNX initializers keep the PyTorch state-dict names (the graphs are
exported without constant folding; ONNX Runtime folds at load time), so :func:`load_state_dict` reads them back
exactly — what ``attnserve export-marian`` needs — and no separate weights file makes the bundle heavier.

The fast decoder writes its caches in place and has no attention outputs; its float32 weights are a second copy.
:func:`add_int8` adds the quantized variant for /translate: the fast encoder and the fast decoder.
:func:`add_float16` adds a float16 variant for GPUs. The manifest's ``graph_forms`` says each graph's form.

The package, by concern: :mod:`~model.export.graphs` (the graph modules), :mod:`~model.export.names` (their input
and output names and axes), :mod:`~model.export.kernels` (attnserve's custom ops), :mod:`~model.export.build`
(torch.onnx export), :mod:`~model.export.check` and :mod:`~model.export.examples` (parity with PyTorch),
:mod:`~model.export.forms` (the graphs' forms), :mod:`~model.export.weights` (reading the weights back),
:mod:`~model.export.bundle` (writing a bundle), :mod:`~model.export.quantize` (the int8 and float16 variants),
:mod:`~model.export.store` (the weights file, float32 or float16) and :mod:`~model.export.reexport` (a bundle exported
again from its own weights).
"""

from model.export.bundle import export_bundle, export_checkpoint, write_manifest
from model.export.kernels import kernel_session
from model.export.quantize import ADD_VARIANT, add_float16, add_int8
from model.export.reexport import export_from_bundle
from model.export.weights import load_model, load_state_dict

__all__ = [
    "ADD_VARIANT",
    "add_float16",
    "add_int8",
    "export_bundle",
    "export_checkpoint",
    "export_from_bundle",
    "kernel_session",
    "load_model",
    "load_state_dict",
    "write_manifest",
]
