"""The shipped en-ja bundle as an Argos package and back: ``attnserve export-marian`` → CTranslate2's
``TransformersConverter`` → a package (config.json's ``add_source_eos``: the shipped bundle's sources end with </s>)
→ ``attnserve import-argos``. The imported bundle decodes the shipped bundle's tokens, greedy and beam 4, on its
float32 graphs (exact and fast) and on its derived int8 graphs, which also serve /translate."""

from __future__ import annotations

import shutil
from pathlib import Path

import ctranslate2
import pytest

from service.cli.main import main
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.runner import open_runner
from service.serving.engine import Engine
from service.serving.translation import Options
from service.settings import Settings
from tests.model.importers.argos_packages import texts, write_package
from tests.service.conftest import Server

SHIPPED = Path(__file__).resolve().parents[3] / "model" / "bundles" / "en-ja"
N_TEXTS = 60
MAX_LENGTH = 24


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A copy of the shipped bundle (its int8 graphs get derived in it) and the bundle imported from its package."""
    work = tmp_path_factory.mktemp("round-trip")
    shipped = Path(shutil.copytree(SHIPPED, work / "shipped"))
    assert main(["export-marian", str(shipped), str(work / "hf")]) == 0
    ctranslate2.converters.TransformersConverter(str(work / "hf")).convert(str(work / "ct2"))
    meta = {"from_code": "en", "to_code": "ja"}
    package = write_package(work / "package", work / "ct2", shipped / "spm.model", meta, {"add_source_eos": True})
    assert main(["import-argos", str(package), str(work / "imported")]) == 0
    return shipped, work / "imported"


def pieces(bundle: Bundle, batch: list[str], beam: int, variant: str, fast: bool) -> list[list[str]]:
    tok = bundle.tokenizer
    requests = [
        DecodeRequest(src=tok.encode_source(t), beam_size=beam, max_length=MAX_LENGTH, prefix=tok.target_prefix)
        for t in batch
    ]
    results = decode(open_runner(bundle, "cpu", variant=variant, role="fast_decoder" if fast else "decoder"), requests)
    return [tok.pieces(r.hypotheses[0].tokens) for r in results]


@pytest.mark.parametrize(("variant", "fast"), [("float32", False), ("float32", True), ("int8", False)])
def test_the_shipped_bundle_imported_from_its_argos_package_decodes_the_same_tokens(
    round_trip: tuple[Path, Path], variant: str, fast: bool
) -> None:
    shipped, imported = (load_bundle(p) for p in round_trip)
    assert (imported.source_lang, imported.target_lang) == ("en", "ja") and variant in [*imported.variants, "float32"]
    assert imported.tokenizer.encode_source("Open file")[-1] == imported.spec.eos_id
    batch = texts(N_TEXTS, SHIPPED / "spm.model", 40)
    for beam in (1, 4):
        want = pieces(shipped, batch, beam, variant, fast)
        assert len({tuple(w) for w in want}) > N_TEXTS // 2, "the texts should get different translations"
        got = pieces(imported, batch, beam, variant, fast)
        differ = [(t, g, w) for t, g, w in zip(batch, got, want, strict=True) if g != w]
        assert not differ, f"beam {beam}: {len(differ)} of {N_TEXTS} differ, first {differ[0]}"


def test_an_imported_bundle_serves_translate_from_its_int8_graphs(round_trip: tuple[Path, Path]) -> None:
    """``ATTNSERVE_GRAPH_VARIANT=int8`` on the imported bundle: /translate answers what the shipped bundle's int8
    graphs give."""
    shipped, imported = round_trip
    batch = texts(20, SHIPPED / "spm.model", 40, seed=1)
    want = Engine.load(shipped, Settings(bundles=[shipped], graph_variant="int8")).translate_now(batch, Options())
    with Server(Settings(bundles=[imported], graph_variant="int8")) as server, server.client() as client:
        answer = client.post("/translate", json={"q": batch, "source": "en", "target": "ja"})
        model_info = client.get("/metrics").text
    assert answer.status_code == 200, answer.text
    assert answer.json()["translatedText"] == [t.text for t in want]
    assert 'name="imported"' in model_info
