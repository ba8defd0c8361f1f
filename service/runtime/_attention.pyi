"""attnserve's attention kernels for ONNX Runtime (service/runtime/_attention.c): a custom-op library that
``SessionOptions.register_custom_ops_library(service.runtime._attention.__file__)`` loads; nothing to call from
Python."""
