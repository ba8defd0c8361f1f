"""The source distribution is complete: it installs into a fresh virtual environment, builds both C extensions
there and imports them, without torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import importlib.util
import onnxruntime as ort
from service.runtime import _attention, _beam
from service.runtime.kernels import attention_library
ort.SessionOptions().register_custom_ops_library(attention_library())
assert importlib.util.find_spec("torch") is None, "a service install must not pull torch"
print(_beam.__file__)
"""


@pytest.mark.timeout(900)
def test_sdist_installs_and_imports_its_extensions_in_a_fresh_venv(tmp_path: Path) -> None:
    pytest.importorskip("build")
    # From the tracked files alone: an egg-info left in the checkout by an editable install would fill the gaps.
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True)
    src = tmp_path / "src"
    for name in tracked.stdout.split("\0"):
        if name and not name.startswith("model/bundles/") and (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(src)], check=True,
                   capture_output=True)  # fmt: skip
    (sdist,) = dist.glob("attnserve-*.tar.gz")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(sdist)], check=True, capture_output=True)
    out = subprocess.run([str(python), "-c", CHECK], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert str(env_dir) in out.stdout  # imported from the installed copy, not from this checkout
