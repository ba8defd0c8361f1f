"""/attention with ``raw`` against the runtimes the models came from: every kind, layer and head of a forced
target equals transformers' ``output_attentions`` (a teacher-forced pass over the same target) for a bundle that
``attnserve export-marian`` wrote and for an imported MarianMTModel; an imported Argos package reads
argos-translate's pieces, and its cross-attention is what CTranslate2 returns with ``return_attention``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
import sentencepiece
import torch
from transformers import MarianMTModel, MarianTokenizer

from service.cli.main import main
from service.settings import Settings
from tests.bundles import make_tiny_bundle, tiny_spm
from tests.model.importers.argos_packages import onmt_package
from tests.model.importers.test_marian import random_marian
from tests.service.conftest import Server

ATOL = 1e-4
# What /translate would mask (printf, a URL, a number), cut (a line break) or trim (edge whitespace): raw keeps it.
PAIRS = [
    ("Open %s at https://example.com/a 42 times", "ファイルを開く"),
    ("Delete the selected files?\nSettings", "設定"),
    ("  Settings  ", "設定を開く"),
]


def raw_attention(server: Server, text: str, target_text: str) -> dict:
    body = {"q": text, "source": "en", "target": "ja", "target_text": target_text, "raw": True}
    with server.client() as c:
        r = c.post("/attention", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def transformers_attention(hf_dir: Path, text: str, target_text: str) -> dict[str, object]:
    """The source and target pieces and every attention of a teacher-forced pass over ``target_text``."""
    model = MarianMTModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
    tok = MarianTokenizer.from_pretrained(hf_dir)
    source = tok(text, return_tensors="pt").input_ids
    labels = tok(text_target=target_text, return_tensors="pt").input_ids  # ends with </s>
    start = torch.tensor([[model.config.decoder_start_token_id]])
    with torch.no_grad():
        out = model(input_ids=source, decoder_input_ids=torch.cat([start, labels[:, :-1]], 1), output_attentions=True)
    return {
        "source_tokens": tok.convert_ids_to_tokens(source[0]),
        "target_tokens": tok.convert_ids_to_tokens(labels[0]),
        "encoder": torch.stack(out.encoder_attentions)[:, 0].numpy(),  # (L, h, S, S)
        "decoder": torch.stack(out.decoder_attentions)[:, 0].numpy(),  # (L, h, T, T)
        "cross": torch.stack(out.cross_attentions)[:, 0].numpy(),  # (L, h, T, S)
    }


def assert_equals_transformers(bundle: Path, hf_dir: Path) -> None:
    with Server(Settings(bundles=[bundle], max_wait_ms=5)) as server:
        for text, target_text in PAIRS:
            got = raw_attention(server, text, target_text)
            want = transformers_attention(hf_dir, text, target_text)
            assert got["source_tokens"] == want["source_tokens"] and got["target_tokens"] == want["target_tokens"]
            assert [s["model_input"] for s in got["segments"]] == [text]  # one segment: the text as given
            for kind in ("encoder", "decoder", "cross"):
                np.testing.assert_allclose(np.array(got[kind]), want[kind], atol=ATOL, rtol=0, err_msg=kind)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("raw")


def test_export_marian_equals_transformers(work: Path) -> None:
    bundle = make_tiny_bundle(work / "ours", work / "ours-spm", seed=3, activation="swish")
    assert main(["export-marian", str(bundle), str(work / "exported")]) == 0
    assert_equals_transformers(bundle, work / "exported")


def test_imported_opus_mt_equals_transformers(work: Path) -> None:
    hf_dir = random_marian(work / "hf", tiny_spm(work))
    assert main(["import-marian", str(hf_dir), str(work / "imported")]) == 0
    assert_equals_transformers(work / "imported", hf_dir)


def test_the_default_path_is_not_raw(work: Path) -> None:
    """The same request without ``raw`` masks the printf form and cuts the line (so raw is what differs)."""
    bundle = make_tiny_bundle(work / "plain", work / "plain-spm", seed=3)
    with Server(Settings(bundles=[bundle], max_wait_ms=5)) as server, server.client() as c:
        text = "Open %s\nSettings"
        body = {"q": text, "source": "en", "target": "ja", "target_text": "%sを開く\n設定"}
        masked = c.post("/attention", json=body).json()
        raw = c.post("/attention", json={**body, "raw": True}).json()
    assert [s["model_input"] for s in masked["segments"]] == ["Open {0}", "Settings"]
    assert [s["model_input"] for s in raw["segments"]] == [text] and "%" in "".join(raw["source_tokens"])


# Argos packages: CTranslate2 returns, with return_attention, the cross-attention of the decoder's alignment layer
# averaged over its first alignment heads (model.bin's decoder/alignment_layer and decoder/alignment_heads; OpenNMT-py
# models not trained with alignments: the last layer's first head).


CONFIGS = {"bare": {}, "bos-eos": {"add_source_bos": True, "add_source_eos": True}}  # model/config.json's


@pytest.fixture(scope="module", params=list(CONFIGS))
def packaged(work: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, Server]]:
    name = request.param
    spm = tiny_spm(work / f"argos-spm-{name}")
    (work / f"argos-{name}").mkdir()
    package = onmt_package(work / f"argos-{name}", spm, None, CONFIGS[name], seed=4)
    assert main(["import-argos", str(package), str(work / f"argos-bundle-{name}")]) == 0
    with Server(Settings(bundles=[work / f"argos-bundle-{name}"], max_wait_ms=5)) as server:
        yield package, server


def ctranslate2_attention(package: Path, text: str, target_text: str) -> tuple[list[str], np.ndarray]:
    """argos-translate's pieces of ``text`` (bare SentencePiece pieces) and CTranslate2's attention over them for
    the target's pieces forced as a prefix: (target pieces, the pieces; the <s> and </s> it adds have no column)."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(package / "sentencepiece.model"))
    pieces, target = sp.encode(text, out_type=str), sp.encode(target_text, out_type=str)
    translator = ctranslate2.Translator(str(package / "model"), device="cpu", compute_type="float32")
    (result,) = translator.translate_batch(
        [pieces], target_prefix=[target], return_attention=True, max_decoding_length=len(target) + 1
    )
    assert result.hypotheses[0][: len(target)] == target
    return pieces, np.array(result.attention[0])[: len(target)]


@pytest.mark.parametrize(("text", "target_text"), PAIRS)
def test_imported_argos_package_equals_ctranslate2(packaged: tuple[Path, Server], text: str, target_text: str) -> None:
    package, server = packaged
    pieces, want = ctranslate2_attention(package, text, target_text)
    got = raw_attention(server, text, target_text)
    config = json.loads((package / "model" / "config.json").read_text())
    bos, eos = ["<s>"] * config.get("add_source_bos", False), ["</s>"] * config.get("add_source_eos", False)
    assert got["source_tokens"] == [*bos, *pieces, *eos]  # argos-translate's pieces, and what config.json adds
    cross = np.array(got["cross"])[-1, 0, : len(want)]  # the last layer's first head: this model's alignment
    cross = cross[:, len(bos) : cross.shape[1] - len(eos)]  # CTranslate2 leaves out the <s> and </s> it adds
    np.testing.assert_allclose(cross, want, atol=ATOL, rtol=0)
