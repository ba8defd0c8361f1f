"""attnserve's attention kernels for ONNX Runtime (service/_attention.c): a custom-op library that
``SessionOptions.register_custom_ops_library(service._attention.__file__)`` loads; nothing to call from Python."""
