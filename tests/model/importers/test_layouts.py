"""Every OPUS-MT layout imported through the command line, then held to transformers as it loads the checkpoint:
greedy and beam-4 tokens identical to ``generate``, attention within 1e-4; then every bundle served by one server
and asked in LibreTranslate's codes by libretranslatepy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto
from transformers import MarianMTModel, MarianTokenizer

from service.cli.main import main
from service.decoding import DecodeRequest, decode
from service.runtime.bundle import load_bundle
from service.runtime.runner import open_runner
from service.settings import Settings
from tests.bundles import tiny_spm
from tests.model.importers.checkpoints import TC_BIG, Layout, random_marian
from tests.service.conftest import Server

TEXTS = ["Open file", "Delete the selected files?", "The file {0} already exists. Replace it?"]
PLAIN = ["Open file", "Delete the selected files?", "Settings"]  # no span: the server decodes them as they are
MAX_NEW = 10

# name -> (layout, import options, served source, served targets)
LAYOUTS = {
    "standard": (Layout("opus-mt-en-ja", ("en", "ja")), [], "en", ["ja"]),
    "tc-big": (Layout("opus-mt-tc-big-en-fr", None, TC_BIG, permuted=True, seed=1), [], "en", ["fr"]),
    "tatoeba": (Layout("opus-mt-deu-jpn", ("deu", "jpn"), seed=2), [], "de", ["ja"]),
    "multi-target": (
        Layout(
            "opus-mt-en-ROMANCE",
            ("en", "ROMANCE"),
            target_tokens=(">>spa<<", ">>por<<", ">>pt_br<<", ">>ita<<", ">>zho_Hant<<"),
            seed=3,
        ),
        ["--targets", "es,pt,zt"],
        "en",
        ["es", "pt", "zt"],
    ),
    "float16": (Layout("opus-mt-fin-swe", ("fin", "swe"), float16=True, seed=4), [], "fi", ["sv"]),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each layout's checkpoint and the bundle `attnserve import-marian` made of it (its import check passed)."""
    work = tmp_path_factory.mktemp("layouts")
    spm = tiny_spm(work)
    out = {}
    for name, (layout, options, _, _) in LAYOUTS.items():
        hf_dir = random_marian(work / layout.dir_name, spm, layout)
        assert main(["import-marian", str(hf_dir), str(work / f"{name}.bundle"), *options]) == 0
        out[name] = (hf_dir, work / f"{name}.bundle")
    return out


def hf_model(hf_dir: Path) -> MarianMTModel:
    """The checkpoint as transformers loads it, computing in float32 (the service's compute type)."""
    return MarianMTModel.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()


def asked(name: str, bundle_dir: Path, texts: list[str] = TEXTS) -> list[tuple[str, str]]:
    """(served target, text as MarianTokenizer reads it) for each text: multi-target texts open with a token."""
    bundle = load_bundle(bundle_dir)
    out = []
    for i, text in enumerate(texts):
        target = LAYOUTS[name][3][i % len(LAYOUTS[name][3])]
        token = bundle.tokenizer.pieces(bundle.targets[target])
        out.append((target, " ".join([*token, text])))
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_manifest(name: str, imported: dict[str, tuple[Path, Path]]) -> None:
    layout, _, source, targets = LAYOUTS[name]
    hf_dir, bundle_dir = imported[name]
    bundle = load_bundle(bundle_dir)
    vocab = json.loads((hf_dir / "vocab.json").read_text())
    assert bundle.source_lang == source
    assert list(bundle.targets) == targets
    spec = bundle.spec
    assert (spec.eos_id, spec.unk_id, spec.pad_id) == (vocab["</s>"], vocab["<unk>"], vocab["<pad>"])
    assert spec.decoder_start_id == vocab["<pad>"]
    codes = bundle.manifest.data["model_languages"]
    assert codes == {"source": (layout.codes or ("en", "fr"))[0], "target": (layout.codes or ("en", "fr"))[1]}
    if layout.target_tokens:
        entries = bundle.manifest.targets
        assert [e["model_code"] for e in entries] == ["spa", "por", "zho_Hant"]  # --targets left out >>ita<<
        assert [bundle.targets[t] for t in targets] == [[vocab[f">>{e['model_code']}<<"]] for e in entries]
    graph = onnx.load(str(bundle_dir / "decoder.onnx"), load_external_data=False).graph
    stored = {t.data_type for t in graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert stored == ({TensorProto.FLOAT16} if layout.float16 else {TensorProto.FLOAT})


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_parity_with_transformers(name: str, imported: dict[str, tuple[Path, Path]]) -> None:
    hf_dir, bundle_dir = imported[name]
    model, tok = hf_model(hf_dir), MarianTokenizer.from_pretrained(hf_dir)
    bundle = load_bundle(bundle_dir)
    exact = open_runner(bundle, "cpu")
    texts = asked(name, bundle_dir)
    sources = [[*bundle.targets[t], *bundle.tokenizer.encode_source(text)] for t, text in zip(
        [t for t, _ in texts], TEXTS, strict=True)]  # fmt: skip
    greedy = decode(exact, [DecodeRequest(src=s, max_length=MAX_NEW, attention=True) for s in sources])
    beam = decode(exact, [DecodeRequest(src=s, beam_size=4, max_length=MAX_NEW) for s in sources])
    seen = set()
    for (_, text), src, ours, ours_beam in zip(texts, sources, greedy, beam, strict=True):
        enc = tok(text, return_tensors="pt")
        assert enc.input_ids[0].tolist() == src  # the target token is one id, first, as MarianTokenizer puts it
        with torch.no_grad():
            want = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW)
            want_beam = model.generate(**enc, num_beams=4, do_sample=False, max_new_tokens=MAX_NEW,
                                       early_stopping=True)  # fmt: skip
            forward = model(**enc, decoder_input_ids=want[:, :-1], output_attentions=True)
        hyp = ours.hypotheses[0]
        assert hyp.tokens == want[0, 1:].tolist(), text
        assert ours_beam.hypotheses[0].tokens == [
            t for t in want_beam[0, 1:].tolist() if t != model.config.pad_token_id
        ]
        seen.add(tuple(hyp.tokens))
        assert ours.encoder_attention is not None
        np.testing.assert_allclose(ours.encoder_attention, torch.stack(forward.encoder_attentions)[:, 0], atol=1e-4)
        cross, self_att = torch.stack(forward.cross_attentions)[:, 0], torch.stack(forward.decoder_attentions)[:, 0]
        for t in range(cross.shape[2]):
            np.testing.assert_allclose(hyp.cross_attention[t], cross[:, :, t], atol=1e-4)
            np.testing.assert_allclose(hyp.self_attention[t], self_att[:, :, t, : t + 1], atol=1e-4)
    assert len(seen) > 1, "the random model's outputs should depend on the input"


@pytest.fixture(scope="module")
def server(imported: dict[str, tuple[Path, Path]]) -> Iterator[Server]:
    """One server with every layout's bundle."""
    with Server(Settings(bundles=[b for _, b in imported.values()], max_wait_ms=5)) as s:
        yield s


def test_served_in_libretranslate_codes(server: Server, imported: dict[str, tuple[Path, Path]]) -> None:
    from libretranslatepy import LibreTranslateAPI

    lt = LibreTranslateAPI(server.url)
    listed = {lang["code"]: set(lang["targets"]) for lang in lt.languages()}
    for name, (_, _, source, targets) in LAYOUTS.items():
        assert set(targets) <= listed[source], name
        hf_dir, bundle_dir = imported[name]
        model, tok = hf_model(hf_dir), MarianTokenizer.from_pretrained(hf_dir)
        for target, text in asked(name, bundle_dir, PLAIN):
            enc = tok(text, return_tensors="pt")
            limit = min(Settings().max_length, 2 * enc.input_ids.shape[1] + 10, model.config.max_position_embeddings)
            with torch.no_grad():
                want = model.generate(**enc, num_beams=1, do_sample=False, max_new_tokens=limit)
            served = lt.translate(text.split(" ", 1)[1] if text.startswith(">>") else text, source, target)
            assert served == tok.decode(want[0], skip_special_tokens=True).strip(), (name, target, text)
    assert "it" not in listed["en"]  # --targets left it out


def test_attention_shows_the_target_token(server: Server, imported: dict[str, tuple[Path, Path]]) -> None:
    vocab = json.loads((imported["multi-target"][0] / "vocab.json").read_text())
    for target, token in (("es", ">>spa<<"), ("zt", ">>zho_Hant<<")):
        r = httpx.post(server.url + "/attention", json={"q": "Open file", "source": "en", "target": target})
        assert r.status_code == 200, r.text
        assert r.json()["source_tokens"][0] == token
        assert token in vocab
