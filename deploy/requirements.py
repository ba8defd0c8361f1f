"""Print the service's runtime requirements from pyproject.toml, one per line, for `pip install -r`.

With --gpu, `onnxruntime` is replaced by the `gpu` extra: onnxruntime-gpu and the nvidia-* wheels of the CUDA and
cuDNN libraries it loads, all pinned (--no-cuda leaves those wheels out, --cuda prints them alone: the Dockerfile
installs them in a layer of their own). The two ONNX Runtime packages install the same
`onnxruntime` module, so an environment must hold exactly one of them. The Dockerfile installs these lists and the
project itself with --no-deps, so pyproject.toml stays the only place the dependencies are written.
"""

import argparse
import re
import tomllib
from pathlib import Path

CUDA_WHEELS = "nvidia-"  # the CUDA and cuDNN libraries' wheels all start so


def name(requirement: str) -> str:
    return re.split(r"[^A-Za-z0-9._-]", requirement, maxsplit=1)[0]


def requirements(gpu: bool, cuda: bool = True) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    deps: list[str] = project["dependencies"]
    if not gpu:
        return deps
    extra = [d for d in project["optional-dependencies"]["gpu"] if cuda or not name(d).startswith(CUDA_WHEELS)]
    return [d for d in deps if name(d) != "onnxruntime"] + extra


def cuda_wheels() -> list[str]:
    return [d for d in requirements(gpu=True) if name(d).startswith(CUDA_WHEELS)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--gpu", action="store_true", help="onnxruntime-gpu and the CUDA wheels instead of onnxruntime")
    which.add_argument("--cuda", action="store_true", help="only the CUDA and cuDNN wheels of --gpu")
    parser.add_argument("--no-cuda", action="store_true", help="with --gpu: without the CUDA and cuDNN wheels")
    args = parser.parse_args()
    if args.no_cuda and not args.gpu:
        parser.error("--no-cuda goes with --gpu")
    listed = cuda_wheels() if args.cuda else requirements(args.gpu, cuda=not args.no_cuda)
    print("\n".join(listed))
