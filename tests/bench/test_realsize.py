"""bench/realsize.py on a tiny shape: the three models built (the grown vocabulary's filler rows drawn with the
trained rows' spread), cached, and one cell run offline and over HTTP, both engines giving the same tokens.

CTranslate2 comes with the ``dev`` extra; outside CI the test skips without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import realsize

from service.runtime.bundle import load_bundle
from tests.bench.peer_engines import need_ctranslate2
from tests.bundles import SENTENCES

need_ctranslate2()

SPM = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-en-ja" / "spm.model"
TINY = realsize.Size(vocab=600, d_model=32, heads=4, d_ff=64, layers=2)


@pytest.fixture(scope="module")
def models(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, realsize.Model]:
    cache = tmp_path_factory.mktemp("realsize")
    return {name: realsize.build(name, cache, TINY, tiny_bundle, SPM) for name in realsize.MODELS}


def test_models_are_built_at_the_size_asked_and_cached(models: dict[str, realsize.Model], tiny_bundle: Path) -> None:
    for name, model in models.items():
        bundle = load_bundle(model.bundle)
        padding = name == "argos"  # import-argos adds a pad id past OpenNMT-py's vocabulary
        assert bundle.spec.vocab_size == TINY.vocab + padding and {"float32", "int8"} <= set(bundle.variants)
        assert (model.ct2 / "model.bin").is_file()
        vocab = json.loads(model.vocab.read_text())
        assert len(vocab) >= TINY.vocab - 1  # CTranslate2's Marian vocabulary drops <pad>
    assert load_bundle(models["argos"].bundle).manifest.default_variant == "int8"
    assert models["argos"].archive is not None and models["argos"].archive.is_file()
    cache = models["trained"].bundle.parent.parent
    stamp = (cache / "trained" / "ready.json").stat().st_mtime
    assert realsize.build("trained", cache, TINY, tiny_bundle, SPM) == models["trained"]
    assert (cache / "trained" / "ready.json").stat().st_mtime == stamp  # not built again


def test_grown_vocabulary_fillers_have_the_trained_rows_spread(models: dict[str, realsize.Model]) -> None:
    from safetensors.numpy import load_file

    hf = models["trained"].bundle.parent / "marian"
    vocab = json.loads((hf / "vocab.json").read_text())
    assert len(vocab) == TINY.vocab and vocab["<pad>"] == TINY.vocab - 1
    fillers = sorted(i for p, i in vocab.items() if p.startswith("▁filler"))
    shared = load_file(str(hf / "model.safetensors"))["model.shared.weight"]
    trained, filler = shared[: fillers[0]], shared[fillers[0] : fillers[-1] + 1]
    assert shared.shape[0] == TINY.vocab and not shared[-1].any()  # the pad row zero
    assert np.allclose(filler.mean(0), trained.mean(0), atol=4 * trained.std(0) / len(filler) ** 0.5)
    assert np.allclose(filler.std(0), trained.std(0), rtol=0.3)


def test_one_cell_offline_and_over_http(models: dict[str, realsize.Model], tmp_path: Path) -> None:
    args = realsize.parse_args(["--threads", "1", "--computes", "float32", "--beams", "1", "--max-length", "8",
                                "--clients", "4", "--seconds", "1"])  # fmt: skip
    sentences = SENTENCES[:6]
    (cell,) = realsize.run_cells(models["argos"], sentences, tmp_path, args)
    assert cell.ct2["tokens"] == cell.ours["tokens"] and len(cell.ours["tokens"]) == len(sentences)
    assert cell.http[0] > 0 and cell.http_same[0] == cell.http_same[1] == cell.http_same[2] > 0
    offline, http = realsize.tables([cell])
    assert "| Argos int8, 74 M | float32 | greedy | 1 |" in offline
    n = cell.http_same[2]
    assert f"{len(sentences)}/{len(sentences)} (" in offline and f"| {n}/{n} / {n}/{n} |" in http
