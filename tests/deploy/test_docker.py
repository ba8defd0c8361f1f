"""The Dockerfile: hadolint, the files it copies, its runtime stages, and the GPU requirement list."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib

from .conftest import IMAGE_ARGOS_CACHE, REPO, run_tool

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def stages() -> dict[str, list[str]]:
    """Stage name -> its instructions, in Dockerfile order."""
    result: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in instructions():
        if line.upper().startswith("FROM "):
            current = result.setdefault(line.split()[-1], [])
        elif current is not None:
            current.append(line)
    return result


def test_hadolint_passes() -> None:
    run_tool("hadolint", "--config", ".hadolint.yaml", "Dockerfile")


def test_copied_files_exist_and_are_in_the_build_context() -> None:
    ignore = [
        p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    assert not any(p.startswith("!") for p in ignore), "the check below does not handle exceptions (!)"
    sources = set()
    for line in instructions():
        words = line.split()
        if words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            sources.update(w for w in words[1:-1] if not w.startswith("--"))
    assert "model" in sources, "the builders derive the shipped bundles' graphs from model/bundles"
    for source in sorted(sources):
        assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
        parts = source.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = [p for p in ignore for prefix in prefixes if fnmatch.fnmatch(prefix, p)]
        assert not excluded, f"COPY {source}: excluded from the build context by .dockerignore {excluded}"


def test_runtime_stages() -> None:
    all_stages = stages()
    assert list(all_stages)[-1] == "cpu", "the CPU runtime must be the last stage: the default target"
    for name in ("cpu", "gpu"):
        stage = " ".join(all_stages[name])
        assert "USER 10001" in stage, f"{name}: must run as the non-root user 10001 (Kubernetes runAsUser)"
        assert "HEALTHCHECK" in stage and "/readyz" in stage, f"{name}: no HEALTHCHECK on /readyz"
        assert "--from=" + name + "-builder" in stage, f"{name}: must copy its own builder's environment"
        assert "/opt/attnserve/bundles" in stage and "ATTNSERVE_BUNDLES" in stage, f"{name}: no bundle"
        assert f"ATTNSERVE_ARGOS_CACHE={IMAGE_ARGOS_CACHE}" in stage, f"{name}: no import cache directory"
        assert f"install -d -o 10001 -g 10001 {IMAGE_ARGOS_CACHE}" in stage, f"{name}: a cache 10001 cannot write"
    assert not {"import", "import-builder"} & set(all_stages), "the server imports Argos packages itself"
    assert "--gpu --no-cuda" in " ".join(all_stages["gpu-builder"]), "the GPU builder installs onnxruntime-gpu"
    assert "FROM cpu-builder AS gpu-builder" in instructions(), "the GPU builder is the CPU builder's environment"
    assert "--cuda" in " ".join(all_stages["cuda-libraries"]), "the CUDA libraries' stage installs --cuda"
    assert "--from=cuda-libraries" in " ".join(all_stages["gpu"]), "gpu: no CUDA libraries"
    # service/runtime/_beam.c and _attention.c are compiled in the CPU builder, never in a runtime image.
    assert "gcc" in " ".join(all_stages["cpu-builder"]), "cpu-builder: no C compiler for the C extensions"
    runtime = ("cpu", "gpu", "cuda-libraries")
    assert not any("gcc" in " ".join(all_stages[name]) for name in runtime), "a compiler at runtime"


def requirement_names(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "requirements.py"), *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [re.split(r"[^A-Za-z0-9._-]", line, maxsplit=1)[0].lower() for line in out.splitlines()]


def test_requirements_have_exactly_one_onnxruntime_and_no_torch() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    cpu, gpu = requirement_names(), requirement_names("--gpu")
    assert len(cpu) == len(project["dependencies"])
    assert "onnxruntime" in cpu and "onnxruntime-gpu" not in cpu
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu
    cuda, without_cuda = requirement_names("--cuda"), requirement_names("--gpu", "--no-cuda")
    assert cuda and all(name.startswith("nvidia-") for name in cuda)
    service = set(cpu) - {"onnxruntime"}
    assert service == set(without_cuda) - {"onnxruntime-gpu"} == set(gpu) - {"onnxruntime-gpu", *cuda}
    assert "torch" not in cpu + gpu


def test_the_gpu_packages_are_pinned() -> None:
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", requirement) for requirement in gpu), gpu
    assert any(requirement.startswith("onnxruntime-gpu==") for requirement in gpu)
