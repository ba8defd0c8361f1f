"""An int8 bundle variant serves /translate; /attention keeps the exact float32 weights; a bundle serves its
manifest's default variant unless ``ATTNSERVE_GRAPH_VARIANT`` names one for every bundle."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.runtime.bundle import BundleError, load_bundle
from service.runtime.manifest import Manifest
from service.serving.engine import Engine
from service.settings import Settings
from tests.service.conftest import Server

BODY = {"q": "Delete the selected files?", "source": "en", "target": "ja", "max_length": 8}


def test_int8_translates_and_attention_stays_exact(tiny_int8_bundle: Path) -> None:
    bundle = tiny_int8_bundle
    fast, exact = Server(Settings(bundles=[bundle], graph_variant="int8")), Server(Settings(bundles=[bundle]))
    with fast, exact, fast.client() as c, exact.client() as e:
        assert c.post("/translate", json=BODY).status_code == 200
        assert c.post("/attention", json=BODY).json() == e.post("/attention", json=BODY).json()
        # int8's fused decoder has no attention outputs: details come from the exact graphs
        details = {**BODY, "return_details": True}
        assert c.post("/translate", json=details).json() == e.post("/translate", json=details).json()


def test_missing_variant_is_a_clear_error(tiny_bundle: Path) -> None:
    with pytest.raises(BundleError, match="no 'int8' graphs"):
        Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle], graph_variant="int8"))


def with_default(bundle: Path, tmp_path: Path, variant: str) -> Path:
    """A copy of ``bundle`` whose manifest records ``variant`` as its default."""
    copy = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    manifest = Manifest.read(copy)
    manifest.default_variant = variant
    manifest.write(copy)
    return copy


@pytest.mark.parametrize(("setting", "served"), [(None, "int8"), ("float32", "float32"), ("int8", "int8")])
def test_a_bundle_serves_its_default_variant_unless_the_setting_names_one(
    tiny_int8_bundle: Path, tmp_path: Path, setting: str | None, served: str
) -> None:
    bundle = with_default(tiny_int8_bundle, tmp_path, "int8")
    engine = Engine.load(bundle, Settings(bundles=[bundle], graph_variant=setting))
    assert engine.variant == served
    assert engine.runners.fast.variant == served  # type: ignore[attr-defined]


def test_without_a_default_a_bundle_serves_float32(tiny_int8_bundle: Path) -> None:
    engine = Engine.load(tiny_int8_bundle, Settings(bundles=[tiny_int8_bundle]))
    assert (engine.variant, engine.runners.fast.variant) == ("float32", "float32")  # type: ignore[attr-defined]


def test_a_default_variant_the_bundle_lacks_is_a_clear_error(tiny_bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="default_variant 'int8', but the bundle has \\['float32'\\]"):
        load_bundle(with_default(tiny_bundle, tmp_path, "int8"))


def test_metrics_name_the_variant_served(tiny_int8_bundle: Path, tmp_path: Path) -> None:
    bundle = with_default(tiny_int8_bundle, tmp_path, "int8")
    for setting, served in ((None, "int8"), ("float32", "float32")):
        with Server(Settings(bundles=[bundle], graph_variant=setting)) as server, server.client() as c:
            info = [ln for ln in c.get("/metrics").text.splitlines() if ln.startswith("attnserve_model_info")]
        assert len(info) == 1 and f'variant="{served}"' in info[0]
