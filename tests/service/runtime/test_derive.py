"""service/runtime/derive.py: the int8 graphs that a bundle derives from its shipped fast graphs, without torch, are the
exporter's to the byte (the manifest's sha256), again on every run, and a bundle refuses what it cannot derive."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.cli.main import main
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import BundleError, load_bundle, sha256
from service.runtime.derive import DeriveError, derive_missing, derived_entries
from service.runtime.manifest import MANIFEST, Manifest
from service.runtime.runner import open_runner
from tests.service.process import REPO

INT8 = ("encoder.int8.onnx", "decoder.int8.onnx")


@pytest.fixture
def underived(tiny_int8_bundle: Path, tmp_path: Path) -> Path:
    """A copy of the tiny int8 bundle as a checkout has it: its derived graphs absent."""
    bundle = Path(shutil.copytree(tiny_int8_bundle, tmp_path / "bundle"))
    for name in INT8:
        (bundle / name).unlink(missing_ok=True)
    return bundle


def manifest_of(bundle: Path) -> Manifest:
    return Manifest.read(bundle)


def test_loading_derives_the_missing_graphs_as_the_exporter_wrote_them(underived: Path) -> None:
    bundle = load_bundle(underived)
    for name in INT8:
        assert sha256(underived / name) == bundle.manifest.sha256[name]
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
    for result in decode(open_runner(bundle, "cpu", variant="int8"), requests):
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
    manifest.derived["encoder.int8.onnx"] = entry
    with pytest.raises(DeriveError, match=r"derived\['encoder\.int8\.onnx'\]: expected"):
        derived_entries(MANIFEST, manifest)
    manifest.write(underived)
    with pytest.raises(BundleError, match=r"derived\['encoder\.int8\.onnx'\]"):
        load_bundle(underived)


def test_attnserve_derive_writes_and_verifies(underived: Path) -> None:
    run = [sys.executable, "-c", "from service.cli.main import main; exit(main())", "derive", str(underived)]
    result = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(Path(line).name for line in result.stdout.splitlines()) == [
        "decoder.int8.onnx (from decoder.fast.onnx)",
        "encoder.int8.onnx (from encoder.fast.onnx)",
    ]
    assert result.stderr == ""  # nothing of the quantizer's
    (underived / "decoder.int8.onnx").write_bytes(b"damaged")
    result = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("attnserve: ") and "decoder.int8.onnx: sha256 does not match" in line


def test_derive_gives_a_float32_bundle_its_int8_graphs(
    tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A bundle without the variant (as ``import-marian`` writes) gets it from the graphs it ships (its exact
    encoder, its fast decoder), says so, and serves it; derive again finds nothing to do and says why."""
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    assert main(["derive", str(bundle)]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == [
        f"{bundle / 'decoder.int8.onnx'} (from decoder.fast.onnx)",
        f"{bundle / 'encoder.int8.onnx'} (from encoder.onnx)",
    ]
    loaded = load_bundle(bundle)
    assert loaded.variants == ["float32", "int8"] and loaded.default_variant == "float32"
    assert not loaded.form("encoder", "int8").attentions
    requests = [
        DecodeRequest(src=loaded.tokenizer.encode_source("Open file"), beam_size=b, max_length=12) for b in (1, 4)
    ]
    for result in decode(open_runner(loaded, "cpu", variant="int8"), requests):
        assert 0 < len(result.hypotheses[0].tokens) <= 12
    assert main(["derive", str(bundle)]) == 0
    assert capsys.readouterr().out == (
        f"{bundle}: nothing to derive: its int8 graphs (decoder.int8.onnx, encoder.int8.onnx) are there (--force "
        "derives them again)\n"
    )


def test_derive_says_why_a_bundle_cannot_have_int8_graphs(
    tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bundle = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = manifest_of(bundle)
    del manifest.graphs["fast_decoder"]
    manifest.write(bundle)
    assert main(["derive", str(bundle)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"attnserve: {bundle}: no fast decoder to quantize (graphs.fast_decoder) — export the bundle again with this "
        "version (`attnserve export BUNDLE OUT --int8`)"
    )
    assert "int8" not in manifest_of(bundle).graphs
