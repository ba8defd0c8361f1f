"""Writing a bundle: the model as ONNX graphs (an encoder and a decoder step with every attention as an output, the
fast encoder and decoder steps for /translate, the forced and the device decoders), its tokenizer and a manifest.

The graphs are built straight from the weights by :mod:`model.export.builder`, which needs no torch (the importers
use it alone); the modules here give it a PyTorch model's weights and check ONNX Runtime against PyTorch before
anything is written. The bundle layout and graph signatures are the contract in docs/ARCHITECTURE.md.

The weights travel inside the graphs: ONNX initializers keep the PyTorch state-dict names, so
:func:`~model.export.weights.load_state_dict` reads them back exactly — what ``attnserve export-marian`` needs — and
one shared weights file holds each distinct tensor once (:mod:`~model.export.store`).

The package, by concern: :mod:`~model.export.builder` (the graphs, torch-free), :mod:`~model.export.names` (their
input and output names and axes), :mod:`~model.export.selection` (the device decoder's tail),
:mod:`~model.export.forms` (the graphs' forms), :mod:`~model.export.store` (the weights file, float32 or float16),
:mod:`~model.export.graphs`, :mod:`~model.export.check` and :mod:`~model.export.examples` (parity with PyTorch),
:mod:`~model.export.build` (the builder's graphs of a PyTorch model, checked), :mod:`~model.export.weights` (reading
the weights back), :mod:`~model.export.bundle` (writing a bundle), :mod:`~model.export.quantize` (the int8 and
float16 variants) and :mod:`~model.export.reexport` (a bundle exported again from its own weights). This file
imports nothing, so that the torch-free modules load without torch.
"""
