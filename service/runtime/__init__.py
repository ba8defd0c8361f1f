"""Loading and running a bundle's graphs: the manifest and its checks, the derived int8 graphs, the ONNX Runtime
sessions, cache tensors, and the C kernels (ONNX Runtime custom ops, beam search arithmetic)."""
