"""``attnserve models`` (service/cli/models.py): each bundle's pairs, origin, parameters, size, precision and
variants, and the pivot pairs, as a table and as JSON, without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import main
from service.cli.models import origin, parameters
from service.runtime.manifest import Manifest
from service.serving.catalog import loaded_bytes
from tests.conftest import FIXTURES, TINY_INT8
from tests.service.pair_bundles import pair_bundle


@pytest.fixture
def bundles(tiny_bundle: Path, tmp_path: Path) -> list[Path]:
    """ja→en and en→de (so ja→de through en), and en→ja with its int8 variant not derived yet."""
    int8 = Path(shutil.copytree(FIXTURES / TINY_INT8, tmp_path / "int8"))
    return [pair_bundle(tiny_bundle, tmp_path, "ja", "en"), pair_bundle(tiny_bundle, tmp_path, "en", "de"), int8]


def run(bundles: list[Path], *extra: str) -> list[str]:
    args = ["models", *extra]
    for b in bundles:
        args += ["--bundle", str(b)]
    return args


def test_json_describes_every_bundle_and_the_pivot_pairs(bundles: list[Path], capsys: pytest.CaptureFixture) -> None:
    assert main(run(bundles, "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    ja_en, en_de, en_ja = out["bundles"]
    assert en_de["pairs"] == [["en", "de"]]
    assert (ja_en["name"], ja_en["pairs"], en_ja["pairs"]) == ("tiny-ja-en", [["ja", "en"]], [["en", "ja"]])
    assert ja_en["origin"] == f"trained here, exported {ja_en['provenance']['exported']}"
    assert ja_en["provenance"]["note"] == "random weights, for tests"
    assert ja_en["precision"] == ["float32"]
    assert ja_en["variants"] == {"float32": "shipped"}
    assert en_ja["variants"] == {"float32": "shipped", "int8": "not derived yet"}
    files = [f for f in Path(ja_en["path"]).iterdir() if f.name != "manifest.json"]
    assert ja_en["disk_bytes"] == sum(f.stat().st_size for f in files)
    assert ja_en["loaded_bytes"] == loaded_bytes(Path(ja_en["path"]), Manifest.read(Path(ja_en["path"])), "float32")
    assert out["pivots"] == [["ja", "en", "de"]]


def test_the_table_has_a_line_a_bundle_and_the_pivot_pairs(bundles: list[Path], capsys: pytest.CaptureFixture) -> None:
    assert main(run(bundles)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["bundle", "pairs", "parameters"]
    assert lines[1].split()[:2] == ["tiny-ja-en", "ja→en"]
    assert "int8 (not derived yet)" in lines[3]
    assert lines[-1].strip() == "ja→de via en (ja→en, en→de)"


def test_loaded_is_the_served_variants_and_unknown_until_it_is_derived(
    bundles: list[Path], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTNSERVE_GRAPH_VARIANT", "int8")
    assert main(run(bundles[2:], "--json")) == 0
    (en_ja,) = json.loads(capsys.readouterr().out)["bundles"]
    assert en_ja["serves"] == "int8" and en_ja["loaded_bytes"] is None
    assert main(["derive", str(bundles[2])]) == 0
    capsys.readouterr()
    assert main(run(bundles[2:], "--json")) == 0
    (en_ja,) = json.loads(capsys.readouterr().out)["bundles"]
    assert en_ja["loaded_bytes"] == loaded_bytes(bundles[2], Manifest.read(bundles[2]), "int8")
    assert main(run(bundles[2:])) == 0
    assert f"{en_ja['loaded_bytes'] / (1 << 20):.1f} MiB" in capsys.readouterr().out.splitlines()[1]


def test_an_unreadable_bundle_is_one_line_and_code_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(run([tmp_path])) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnserve: {tmp_path}: cannot be read as a bundle") and err.count("\n") == 1


def test_parameters_are_the_models(tiny_bundle: Path) -> None:
    """The count from the manifest's config is what PyTorch counts, for each switch that changes it."""
    torch_model = pytest.importorskip("model.transformer")
    config = Manifest.read(tiny_bundle).model
    for change in ({}, {"tie_embeddings": False}, {"normalize_before": True}):
        c = {**config, **change}
        model = torch_model.make_model(torch_model.TransformerConfig(**c))
        assert parameters(c) == sum(p.numel() for p in model.parameters())


def test_models_never_imports_torch(bundles: list[Path]) -> None:
    code = (
        "import sys; from service.cli.main import main; "
        f"code = main({run(bundles)!r}); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_origin_names_the_importer_and_its_source() -> None:
    assert origin({"imported_from": "opus-mt-en-de", "command": "attnserve import-marian ..."}) == (
        "imported from opus-mt-en-de"
    )
    argos = {"imported_from": "translate-en_de-1_0.argosmodel", "ctranslate2": {"spec": "TransformerSpec"}}
    assert origin(argos) == "imported from translate-en_de-1_0.argosmodel (Argos package, CTranslate2 TransformerSpec)"
    assert origin({}) == "unknown (no provenance in the manifest)"


def test_each_bundle_shows_the_variant_it_serves(
    bundles: list[Path], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its manifest's default (float32 where none is recorded), or ``ATTNSERVE_GRAPH_VARIANT`` for every bundle."""
    manifest = Manifest.read(bundles[2])
    manifest.default_variant = "int8"
    manifest.write(bundles[2])
    assert main(run(bundles, "--json")) == 0
    assert [b["serves"] for b in json.loads(capsys.readouterr().out)["bundles"]] == ["float32", "float32", "int8"]
    assert main(run(bundles)) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[3:8] == ["disk", "loaded", "precision", "variants", "serves"]
    monkeypatch.setenv("ATTNSERVE_GRAPH_VARIANT", "float32")
    assert main(run(bundles, "--json")) == 0
    assert {b["serves"] for b in json.loads(capsys.readouterr().out)["bundles"]} == {"float32"}


def test_a_shipped_bundle_whose_pair_the_users_serve_is_named_shadowed(
    tiny_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = pair_bundle(tiny_bundle, tmp_path / "shipped", "en", "de")
    users = pair_bundle(tiny_bundle, tmp_path / "mine", "en", "de")
    monkeypatch.setenv("ATTNSERVE_SHIPPED_BUNDLES", str(tmp_path / "shipped"))
    assert main(run([shipped, users], "--json")) == 0
    listed = {b["path"]: b["shadowed_by"] for b in json.loads(capsys.readouterr().out)["bundles"]}
    assert listed == {str(shipped): str(users), str(users): None}
    assert main(run([shipped, users])) == 0
    table = capsys.readouterr().out
    assert f"  tiny-en-de  en→de  by {users}" in table.split("shadowed (shipped, not served")[1]
