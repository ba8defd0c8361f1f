"""Print the service's runtime requirements from pyproject.toml, one per line, for `pip install -r`.

With --gpu, `onnxruntime` is replaced by the `gpu` extra (`onnxruntime-gpu`). With --importer, only what
`attnserve import-argos` adds to the service's: the `train` extra's torch (the Dockerfile's `import` target).
The two packages install the same `onnxruntime` module, so an image must hold exactly one of them; installing `.`
and then swapping the package would leave pip's metadata inconsistent. The Dockerfile installs this list, then
the project itself with --no-deps, so pyproject.toml stays the only place the dependencies are written.
"""

import argparse
import re
import tomllib
from pathlib import Path


def name(requirement: str) -> str:
    return re.split(r"[^A-Za-z0-9._-]", requirement, maxsplit=1)[0]


def requirements(gpu: bool, importer: bool = False) -> list[str]:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    if importer:
        return [d for d in project["optional-dependencies"]["train"] if name(d) == "torch"]
    deps: list[str] = project["dependencies"]
    if not gpu:
        return deps
    return [d for d in deps if name(d) != "onnxruntime"] + project["optional-dependencies"]["gpu"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="onnxruntime-gpu instead of onnxruntime")
    parser.add_argument("--importer", action="store_true", help="only what import-argos adds: torch")
    args = parser.parse_args()
    print("\n".join(requirements(args.gpu, args.importer)))
