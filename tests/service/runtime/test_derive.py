"""service/runtime/derive.py: the int8 graphs that a bundle derives from its shipped fast graphs, without torch, are the
exporter's to the byte (the manifest's sha256), again on every run, and a bundle refuses what it cannot derive."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.decoding import DecodeRequest, decode
from service.runtime.bundle import BundleError, load_bundle, sha256
from service.runtime.derive import DeriveError, derive_missing, derived_entries
from service.runtime.runner import Runner
from tests.service.process import REPO

INT8 = ("encoder.int8.onnx", "decoder.int8.onnx")


@pytest.fixture
def underived(tiny_int8_bundle: Path, tmp_path: Path) -> Path:
    """A copy of the tiny int8 bundle as a checkout has it: its derived graphs absent."""
    bundle = Path(shutil.copytree(tiny_int8_bundle, tmp_path / "bundle"))
    for name in INT8:
        (bundle / name).unlink(missing_ok=True)
    return bundle


def manifest_of(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def test_loading_derives_the_missing_graphs_as_the_exporter_wrote_them(underived: Path) -> None:
    bundle = load_bundle(underived)
    for name in INT8:
        assert sha256(underived / name) == bundle.manifest["sha256"][name]
    assert bundle.graph("encoder", "int8").name == "encoder.int8.onnx"


def test_derivation_is_deterministic(underived: Path) -> None:
    manifest = manifest_of(underived)
    first = derive_missing(underived, manifest)
    assert sorted(p.name for p in first) == sorted(INT8)
    before = {name: (underived / name).read_bytes() for name in INT8}
    derive_missing(underived, manifest, force=True)
    assert {name: (underived / name).read_bytes() for name in INT8} == before
    assert derive_missing(underived, manifest) == []  # present: nothing to do


def test_a_derive_logs_only_its_own_lines(underived: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ONNX Runtime's quantizer logs through the root logger ("Please consider to run pre-processing"); none of it
    reaches a handler, and the root logger is left as it was."""
    root = logging.getLogger()
    filters, handlers = list(root.filters), list(root.handlers)
    with caplog.at_level(logging.DEBUG):
        derive_missing(underived, manifest_of(underived))
    assert [(r.name, r.getMessage().split(" from ")[0]) for r in caplog.records] == [
        ("service.runtime.derive", f"deriving {underived / name}") for name in sorted(INT8)
    ]
    assert (root.filters, root.handlers) == (filters, handlers)
    assert logging.getLogger("onnxruntime").level == logging.NOTSET


def test_the_derived_graphs_decode(underived: Path) -> None:
    """The int8 runner loads the derived graphs and decodes; its greedy tokens end with </s> within the limit."""
    bundle = load_bundle(underived)
    requests = [
        DecodeRequest(src=bundle.tokenizer.encode_source(t), beam_size=1, max_length=40)
        for t in ("Open file", "Settings")
    ]
    for result in decode(Runner(bundle, "cpu", variant="int8"), requests):
        tokens = result.hypotheses[0].tokens
        assert 0 < len(tokens) <= 40 and all(isinstance(t, int | np.integer) for t in tokens)


def test_a_read_only_bundle_names_the_graph_it_cannot_derive(underived: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("service.runtime.derive.os.access", lambda path, mode: False)  # root may write anywhere
    with pytest.raises(BundleError, match=r"int8\.onnx: missing, and .* is read-only — run `attnserve derive"):
        load_bundle(underived)


def test_a_damaged_derived_graph_is_refused_with_how_to_derive_it_again(underived: Path) -> None:
    load_bundle(underived)
    (underived / "encoder.int8.onnx").write_bytes(b"half a graph")
    with pytest.raises(BundleError, match=r"encoder\.int8\.onnx: sha256 does not match .* derive it again"):
        load_bundle(underived)
    (underived / "encoder.int8.onnx").unlink()
    load_bundle(underived)  # derived again


def test_a_damaged_source_is_named_before_anything_is_derived(underived: Path) -> None:
    (underived / "encoder.fast.onnx").write_bytes(b"not a graph")
    with pytest.raises(BundleError, match=r"encoder\.fast\.onnx: sha256 does not match .* corrupted or replaced"):
        load_bundle(underived)
    assert not (underived / "encoder.int8.onnx").exists()


def test_a_source_that_cannot_be_derived_is_one_error_naming_the_file(underived: Path) -> None:
    (underived / "encoder.fast.onnx").write_bytes(b"not a graph")
    with pytest.raises(DeriveError, match=r"encoder\.int8\.onnx: cannot be derived from encoder\.fast\.onnx"):
        derive_missing(underived, manifest_of(underived))
    assert [p.name for p in underived.iterdir() if p.name.endswith(".tmp")] == []  # no half-written file left


@pytest.mark.parametrize(
    "entry",
    [{"from": "encoder.fast.onnx"}, {"from": "encoder.fast.onnx", "by": "float8"}, "encoder.fast.onnx"],
)
def test_a_malformed_derived_entry_is_refused(entry: object, underived: Path) -> None:
    manifest = manifest_of(underived)
    manifest["derived"]["encoder.int8.onnx"] = entry
    with pytest.raises(DeriveError, match=r"derived\['encoder\.int8\.onnx'\]: expected"):
        derived_entries("manifest.json", manifest)
    (underived / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=r"derived\['encoder\.int8\.onnx'\]"):
        load_bundle(underived)


def test_attnserve_derive_writes_and_verifies(underived: Path) -> None:
    run = [sys.executable, "-c", "from service.cli.main import main; exit(main())", "derive", str(underived)]
    result = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(Path(line).name for line in result.stdout.splitlines()) == sorted(INT8)
    assert result.stderr == ""  # nothing of the quantizer's
    (underived / "decoder.int8.onnx").write_bytes(b"damaged")
    result = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("attnserve: ") and "decoder.int8.onnx: sha256 does not match" in line
