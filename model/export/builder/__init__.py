"""The serving graphs built straight from the weights, without torch: from a :class:`~model.config.TransformerConfig`
and a dict of numpy weights named as model/transformer.py's state dict (a checkpoint's, an Argos package's, an
OPUS-MT model's), ONNX graphs through the ``onnx`` package's helper API.

By concern: :mod:`.ops` (one graph under construction), :mod:`.layers` (the Transformer's pieces as nodes),
:mod:`.graphs` (every graph form a bundle serves), :mod:`.weights` (the weights in and back out of a bundle) and
:mod:`.write` (a whole bundle). Nothing here imports torch; tests/model/export/builder holds every graph equal to
model/transformer.py.
"""
