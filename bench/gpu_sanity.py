"""What a GPU machine runs on, before anything is measured there: the execution provider that the service's
``ATTNSERVE_PROVIDER=auto`` gets, the CUDA libraries loaded, ``gpu_mem_limit`` as a session sees it (a runner built
with ``ATTNSERVE_GPU_MEM_LIMIT_MB``), and the device's memory as /metrics reads it.

    python bench/gpu_sanity.py --out sanity.json                  # exits 1 unless the service gets CUDA
    python bench/gpu_sanity.py --provider cpu --out sanity.json   # where the CPU stands in: exits 1 unless the CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import ROOT

LIMIT_MB = 1024
LIBRARIES = ("libcudart.so", "libcublasLt.so", "libcublas.so", "libcurand.so", "libcudnn.so")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / "model" / "bundles" / "en-ja")
    ap.add_argument("--provider", choices=["cuda", "cpu"], default="cuda", help="what the machine must give")
    ap.add_argument("--out", type=Path, required=True, help="the findings as JSON")
    return ap.parse_args(argv)


def findings(bundle_dir: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from service.runtime.bundle import load_bundle
    from service.runtime.gpu_memory import GpuMemoryError, device_memory, loaded_library
    from service.runtime.providers import CUDA, choose_provider, cuda_unusable
    from service.runtime.runner import open_runner

    chosen = choose_provider("auto")
    listed = ort.get_available_providers()
    runner = open_runner(load_bundle(bundle_dir, verify=False), "auto", 1, gpu_mem_limit_mb=LIMIT_MB)
    try:
        memory: Any = list(device_memory())  # used, total
    except GpuMemoryError as e:
        memory = str(e)
    return {
        "onnxruntime": ort.__version__,
        "listed": listed,
        "chosen": chosen,
        "why_not_cuda": cuda_unusable() if CUDA in listed else "this ONNX Runtime has no CUDA execution provider",
        "libraries": {stem: loaded_library(stem) for stem in LIBRARIES},
        "gpu_mem_limit": runner.decoder.get_provider_options().get(CUDA, {}).get("gpu_mem_limit"),
        "device_memory": memory,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    found = findings(args.bundle)
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    print(json.dumps(found, indent=1), flush=True)
    if args.provider == "cpu":
        return 0 if found["chosen"] == "CPUExecutionProvider" else 1
    applied, read = found["gpu_mem_limit"] == str(LIMIT_MB << 20), isinstance(found["device_memory"], list)
    return 0 if found["chosen"] == "CUDAExecutionProvider" and applied and read else 1


if __name__ == "__main__":
    sys.exit(main())
