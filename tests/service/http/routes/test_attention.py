"""POST /attention against a real uvicorn on loopback: shapes, causality, the ONNX steps' weights, filters; the
translation /translate gives, spans recovered as /translate recovers them (the shipped model, and a model that
mangles its stand-ins)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from service.http import arrays
from service.http.app import create_app
from service.http.schemas import SpanPath
from service.runtime.bundle import load_bundle
from service.serving.engine import Runners
from service.serving.restoring import PATHS
from service.serving.startup import Checked
from service.settings import EN_JA, Settings
from service.text.pipeline import TextPipeline
from tests.service.conftest import Server, ServerFactory, assert_loading
from tests.service.mangler import Bundle, Mangler

KINDS = ("encoder", "decoder", "cross")


def attention(server: Server, **body: object) -> dict:
    with server.client() as c:
        r = c.post("/attention", json={"q": "Delete the selected files?", "source": "en", "target": "ja", **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_attention_shapes_rows_and_causality(server: Server, tiny_bundle: Path) -> None:
    spec = load_bundle(tiny_bundle).spec
    body = attention(server, max_length=9)
    S, T = len(body["source_tokens"]), len(body["target_tokens"])
    assert len(body["decoder_input_tokens"]) == T
    shapes = {
        "encoder": (spec.n_encoder_layers, spec.h, S, S),
        "decoder": (spec.n_decoder_layers, spec.h, T, T),
        "cross": (spec.n_decoder_layers, spec.h, T, S),
    }
    for kind, shape in shapes.items():
        a = np.array(body[kind])
        assert a.shape == shape, kind
        np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
    decoder = np.array(body["decoder"])
    assert np.all(decoder[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)


def test_forced_target_and_cross_attention_equal_the_onnx_steps(server: Server, tiny_bundle: Path) -> None:
    bundle = load_bundle(tiny_bundle)
    target_text = "ファイルを開く"
    body = attention(server, target_text=target_text)
    forced = bundle.tokenizer.encode_target(target_text)
    assert body["target_tokens"] == bundle.tokenizer.pieces(forced)

    # Run the two graphs by hand, one step at a time, and compare the cross-attention rows.
    enc = ort.InferenceSession(str(bundle.graph("encoder")), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(bundle.graph("decoder")), providers=["CPUExecutionProvider"])
    src = np.array([bundle.tokenizer.encode_source("Delete the selected files?")], np.int64)
    positions = np.arange(src.shape[1])[None]
    _, *cross = enc.run(None, {"input_ids": src, "attention_mask": np.ones_like(src), "position_ids": positions})
    spec = bundle.spec
    L = spec.n_decoder_layers
    ck, cv = cross[:L], cross[L:]
    pk = pv = [np.zeros((1, spec.h, 0, spec.d_k), np.float32)] * L
    previous = spec.decoder_start_id
    for t, token in enumerate(forced):
        feed = {
            "input_ids": np.array([[previous]], np.int64),
            "position_ids": np.array([[t]], np.int64),
            "encoder_attention_mask": np.ones_like(src),
            "self_attention_mask": np.ones((1, t + 1), np.int64),
            **{f"cross_keys.{l}": ck[l] for l in range(L)},
            **{f"cross_values.{l}": cv[l] for l in range(L)},
            **{f"past_keys.{l}": pk[l] for l in range(L)},
            **{f"past_values.{l}": pv[l] for l in range(L)},
        }
        _, *present, self_att, cross_att = dec.run(None, feed)
        pk, pv = present[:L], present[L:]
        np.testing.assert_allclose(np.array(body["cross"])[:, :, t], cross_att[:, 0], atol=1e-5)
        np.testing.assert_allclose(np.array(body["decoder"])[:, :, t, : t + 1], self_att[:, 0], atol=1e-5)
        previous = token


def test_attention_filters(server: Server) -> None:
    body = attention(server, layers=[1], heads=[0, 3], kinds=["cross", "encoder"], max_length=5)
    full = attention(server, max_length=5)
    assert "decoder" not in body
    assert body["layers"] == {"cross": [1], "encoder": [1]} and body["heads"] == [0, 3]
    for kind in ("cross", "encoder"):
        a, b = np.array(body[kind]), np.array(full[kind])
        np.testing.assert_array_equal(a, b[[1]][:, [0, 3]])


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"q": "x", "target": "ja", "layers": [7]}, 422, "layers [7]"),
        ({"q": "x", "target": "ja", "heads": [9]}, 422, "heads [9]"),
        ({"q": "x", "target": "fr"}, 400, "en→ja"),
        ({"q": "x", "target": "ja", "kinds": ["nope"]}, 422, "kinds"),
        ({"q": "x", "target": "ja", "beam_size": 9}, 422, "max_beam_size=8"),
    ],
)
def test_attention_bad_requests(server: Server, body: dict, status: int, needle: str) -> None:
    with server.client() as c:
        r = c.post("/attention", json=body)
    assert r.status_code == status and needle in r.json()["error"], r.text


@pytest.mark.parametrize(("encoding", "atol"), [("float16", 5e-4), ("uint8", 0.5 / 255)])
def test_compact_encodings_carry_the_same_weights(server: Server, encoding: str, atol: float) -> None:
    plain = attention(server, max_length=9)
    compact = attention(server, max_length=9, encoding=encoding)
    assert {k: v for k, v in compact.items() if k not in KINDS} == {k: v for k, v in plain.items() if k not in KINDS}
    for kind in KINDS:
        assert compact[kind]["dtype"] == encoding
        np.testing.assert_allclose(arrays.decode(compact[kind]), np.array(plain[kind]), atol=atol)


def test_gzip_only_when_the_client_accepts_it(server: Server) -> None:
    body = {"q": "Delete the selected files?", "source": "en", "target": "ja", "max_length": 9}
    with httpx.Client(base_url=server.url) as c:
        raw = c.post("/attention", json=body, headers={"Accept-Encoding": "identity"})
        zipped = c.post("/attention", json=body, headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in raw.headers
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) < int(raw.headers["content-length"])
    assert zipped.json() == raw.json()  # httpx decompresses


@pytest.mark.parametrize("source", ["auto", "en"])
def test_attention_is_503_while_the_models_load(loading_server: Server, source: str) -> None:
    with loading_server.client() as c:
        assert_loading(c.post("/attention", json={"q": "Open file", "source": source, "target": "ja"}))


# Texts that /translate cuts, masks or both: edge whitespace, several lines (empty ones, \r\n), several sentences on
# a line longer than sentence_split_chars (200), and protected spans (printf, braces, tags).
LONG_LINE = (
    "Delete the selected files? The files are removed from the disk and cannot be restored later. "
    "Choose another folder to keep a copy of them first. "
    "Close the window to cancel the operation now, or wait for it to end."
)
assert len(LONG_LINE) > 200
LAID_OUT = [
    "Open the selected file\n",
    "  Delete the selected files?  ",
    "Open file\r\n\nSave the file\nClose",
    LONG_LINE,
    "Save %s as %d files",
    "Open {name} in {0} now",
    "Click <b>Open</b> to see the <i>file</i>",
    f" Open %1$s\n\n{LONG_LINE} <a href='x'>here</a>\n",
]


def segments_of(body: dict) -> list[dict]:
    """Each segment with its tokens and weights, wherever the answer puts them (top level for one segment)."""
    if len(body["segments"]) == 1:
        return [{**body["segments"][0], **{k: body[k] for k in KINDS if k in body}}]
    return body["segments"]


@pytest.mark.parametrize("text", LAID_OUT)
def test_attention_explains_the_translation_that_translate_gives(server: Server, text: str) -> None:
    with server.client() as c:
        translated = c.post("/translate", json={"q": text, "source": "en", "target": "ja"}).json()["translatedText"]
    body = attention(server, q=text)
    assert body["translatedText"] == translated
    for segment in segments_of(body):
        start, end = segment["source_offsets"]
        assert text[start:end] == text[start:end].strip() != ""
        assert "<0x0A>" not in segment["source_tokens"] and "<0x0D>" not in segment["source_tokens"]
        assert "\n" not in translated[slice(*segment["target_offsets"])]
        S, T = len(segment["source_tokens"]), len(segment["target_tokens"])
        for kind, (rows, cols) in {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}.items():
            a = np.array(segment[kind])
            assert a.shape[2:] == (rows, cols), kind  # bertviz's [layer][head][query][key] within the segment
            np.testing.assert_allclose(a.sum(-1), 1.0, atol=cols * 5e-7 + 1e-6)  # each weight rounded to 1e-6


def test_a_text_of_one_segment_answers_as_a_plain_sentence_does(server: Server) -> None:
    plain, spaced = attention(server, q="Open the selected file"), attention(server, q="Open the selected file\n")
    assert spaced["translatedText"] == plain["translatedText"] + "\n"
    for body in (plain, spaced):
        (segment,) = body["segments"]
        assert not set(KINDS) & set(segment)  # the weights are at the top level only
        assert segment["source_offsets"] == [0, 22] and segment["model_input"] == "Open the selected file"
        assert segment["target_offsets"] == [0, len(plain["translatedText"])]
        assert all(segment[k] == body[k] for k in ("source_tokens", "target_tokens", "decoder_input_tokens"))
    assert {k: v for k, v in spaced.items() if k != "translatedText"} == {
        k: v for k, v in plain.items() if k != "translatedText"
    }


def test_segments_carry_their_offsets_and_weights(server: Server) -> None:
    text = "  Save %s now\n\nOpen the file  "
    body = attention(server, q=text)
    assert not {"source_tokens", "target_tokens", "decoder_input_tokens", *KINDS} & set(body)
    first, second = body["segments"]
    assert (first["source_offsets"], first["model_input"]) == ([2, 13], "Save {0} now")
    assert (second["source_offsets"], second["model_input"]) == ([15, 28], "Open the file")
    translation = body["translatedText"]
    assert translation.startswith("  ") and translation.endswith("  ") and "\n\n" in translation
    assert "%s" in translation[slice(*first["target_offsets"])]
    alone = attention(server, q="Open the file")  # a segment's weights are those of its line alone (batched: 1e-5)
    assert second["target_tokens"] == alone["target_tokens"]
    for kind in KINDS:
        np.testing.assert_allclose(np.array(second[kind]), np.array(alone[kind]), atol=1e-5)


def test_a_forced_target_is_laid_out_as_its_source(server: Server, tiny_bundle: Path) -> None:
    tok = load_bundle(tiny_bundle).tokenizer
    body = attention(server, q="Open %s\n\nSave the file", target_text="%s を開く\nファイルを保存")
    first, second = body["segments"]
    assert first["target_tokens"] == tok.pieces(tok.encode_target("{0} を開く"))
    assert second["target_tokens"] == tok.pieces(tok.encode_target("ファイルを保存"))
    assert body["translatedText"].split("\n\n")[1] == "ファイルを保存"
    assert "%s" in body["translatedText"].split("\n\n")[0]
    with server.client() as c:
        r = c.post("/attention", json={"q": "Open file\nSave", "target": "ja", "target_text": "ファイルを開く"})
    assert r.status_code == 422
    assert r.json()["error"].startswith("target_text has 1 lines with text where q has 2")


@pytest.mark.parametrize(("encoding", "atol"), [("float16", 5e-4), ("uint8", 0.5 / 255)])
def test_compact_encodings_and_gzip_carry_every_segment(server: Server, encoding: str, atol: float) -> None:
    body = {"q": "Open the file\nSave %s", "source": "en", "target": "ja", "max_length": 9}
    with httpx.Client(base_url=server.url, timeout=60) as c:
        plain = c.post("/attention", json=body).json()
        zipped = c.post("/attention", json={**body, "encoding": encoding}, headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    compact = zipped.json()
    assert len(compact["segments"]) == len(plain["segments"]) == 2
    for ours, theirs in zip(compact["segments"], plain["segments"], strict=True):
        assert {k: v for k, v in ours.items() if k not in KINDS} == {k: v for k, v in theirs.items() if k not in KINDS}
        for kind in KINDS:
            assert ours[kind]["dtype"] == encoding
            np.testing.assert_allclose(arrays.decode(ours[kind]), np.array(theirs[kind]), atol=atol)


MULTI_TAG = "<b>zoom</b>: scroll, <b>pan</b>: shift+drag, <b>rotate</b>: ctrl+drag, <b>reset</b>: double-click (%d%%)"
NUMBERS = "Receives 60% defense on sand and 30% in water"


@pytest.fixture(scope="module")
def shipped() -> Iterator[Server]:
    with Server(Settings(bundles=[EN_JA], max_wait_ms=20)) as s:
        yield s


def both(client: httpx.Client | TestClient, text: str, **options: Any) -> tuple[dict, dict]:
    """/translate's answer with details, and /attention's, for one text."""
    body = {"q": text, "source": "en", "target": "ja", **options}
    translated = client.post("/translate", json={**body, "return_details": True})
    explained = client.post("/attention", json={**body, "kinds": ["cross"]})
    assert translated.status_code == explained.status_code == 200, (translated.text, explained.text)
    return translated.json(), explained.json()


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("text", [MULTI_TAG, NUMBERS])
def test_the_shipped_model_explains_the_recovered_translation(shipped: Server, text: str, beam: int) -> None:
    with shipped.client() as c:
        translated, explained = both(c, text, beam_size=beam)
    assert explained["translatedText"] == translated["translatedText"]
    (segment,) = explained["segments"]
    details = translated["details"]
    assert segment["spans"] == details["spans"] and explained["target_tokens"] == details["tokens"]
    assert not any(f"{{{i}" in explained["translatedText"] for i in range(10))  # no stand-in or piece of one
    if text == MULTI_TAG:
        assert segment["spans"] != "decoded"  # the first decode broke its stand-ins


@pytest.fixture
def mangling(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The app serving :class:`Mangler`, a model that writes "A {lg} B 7" for any text."""
    runner = Mangler()
    monkeypatch.setattr(Runners, "build", classmethod(lambda cls, bundle, settings: cls(runner, runner)))
    with TestClient(create_app(Settings(max_wait_ms=1), Checked([Bundle()]))) as client:  # type: ignore[list-item]
        deadline = time.monotonic() + 30
        while (ready := client.get("/readyz")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.status_code == 200, ready.text
        yield client


def _appended_only(*args: object, **kwargs: object) -> str:
    return "A {lg} B %s"  # every placement broken: only appending is left


@pytest.mark.parametrize(
    ("options", "broken", "path", "text", "tokens"),
    [
        ({}, False, "constrained", "A %s", ["▁A", "▁{", "0", "}", "</s>"]),  # the constrained decode's tokens
        ({"max_length": 3}, False, "attention", "%s A lg", ["▁A", "▁{", "lg"]),  # the first decode's
        ({}, True, "appended", "A B %s", ["▁A", "▁{", "lg", "}", "▁B", "▁7", "</s>"]),
    ],
)
def test_each_recovery_path_is_named_with_the_tokens_of_its_decode(
    mangling: TestClient, monkeypatch: pytest.MonkeyPatch, options: dict, broken: bool, path: str, text: str,
    tokens: list[str],
) -> None:  # fmt: skip
    if broken:
        monkeypatch.setattr(TextPipeline, "restored", _appended_only)
    translated, explained = both(mangling, "C %s C", **options)
    assert (translated["translatedText"], translated["details"]["spans"]) == (text, path)
    assert explained["translatedText"] == text
    assert explained["segments"][0]["spans"] == path
    assert explained["target_tokens"] == translated["details"]["tokens"] == tokens
    assert np.array(explained["cross"]).shape == (1, 2, len(tokens), len(explained["source_tokens"]))


def test_a_forced_target_has_no_span_path(mangling: TestClient) -> None:
    body = {"q": "C %s C", "source": "en", "target": "ja", "target_text": "A %s B 7"}
    explained = mangling.post("/attention", json=body).json()
    assert explained["translatedText"] == "A %s B 7"  # broken on /translate (a made-up 7), the caller's answer here
    assert "spans" not in explained["segments"][0]


def test_the_schema_names_every_path() -> None:
    assert get_args(SpanPath) == PATHS


def test_raw_is_the_whole_text_as_given(server: Server, tiny_bundle: Path) -> None:
    tok = load_bundle(tiny_bundle).tokenizer
    text = " Open %s\nSave 42 "
    body = attention(server, q=text, raw=True, target_text="%sを開く\n保存", kinds=["cross"])
    (segment,) = body["segments"]
    assert segment["model_input"] == text and segment["source_offsets"] == [0, len(text)]
    assert body["source_tokens"] == tok.pieces(tok.encode_source(text))
    assert body["target_tokens"] == tok.pieces(tok.encode_target("%sを開く\n保存"))
    assert body["translatedText"] == tok.decode(tok.encode_target("%sを開く\n保存"))
    with server.client() as c:
        r = c.post("/attention", json={"q": text, "source": "en", "target": "ja", "raw": True, "keep": ["Save"]})
    assert r.status_code == 422 and "raw" in r.json()["error"], r.text


MANY = ["Delete the selected files?", "Open %s\nSave the file", "  Settings", "Could not open %s: permission denied"]


def assert_same_answer(batched: dict, single: dict) -> None:
    """The same tokens, offsets and text; the same weights within float32 batching's differences."""
    kinds = [k for k in KINDS if k in single]
    assert {k: v for k, v in batched.items() if k not in KINDS and k != "segments"} == {
        k: v for k, v in single.items() if k not in KINDS and k != "segments"
    }
    for kind in kinds:
        np.testing.assert_allclose(np.array(batched[kind]), np.array(single[kind]), atol=1e-5)
    for b, s in zip(batched["segments"], single["segments"], strict=True):
        assert {k: v for k, v in b.items() if k not in KINDS} == {k: v for k, v in s.items() if k not in KINDS}
        for kind in [k for k in KINDS if k in s]:
            np.testing.assert_allclose(np.array(b[kind]), np.array(s[kind]), atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"raw": True, "kinds": ["cross", "decoder"]},
        {"target_text": ["ファイル", "%sを開く\n保存", "設定", "%s"]},
        {"alignments": True, "kinds": ["cross"]},
    ],
    ids=["search", "raw", "forced", "alignments"],
)
def test_a_list_of_texts_answers_each_as_it_is_answered_alone(server: Server, options: dict) -> None:
    batched = attention(server, q=MANY, max_length=8, **options)
    assert isinstance(batched, list) and len(batched) == len(MANY)
    for i, text in enumerate(MANY):
        alone = {k: v[i] if k == "target_text" else v for k, v in options.items()}
        assert_same_answer(batched[i], attention(server, q=text, max_length=8, **alone))


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"q": ["Open", "Save"], "target_text": ["開く"]}, 422, "target_text: 1 texts where q has 2"),
        ({"q": ["Open"], "target_text": "開く"}, 422, "a list of as many texts for a list q"),
        ({"q": "Open", "target_text": ["開く"]}, 422, "a string for a string q"),
        ({"q": ["Open", " "]}, 400, "q[1] is empty"),
        ({"q": []}, 422, "q is an empty list"),
        ({"q": ["Open"] * 65}, 413, "max_texts=64"),
    ],
)
def test_bad_lists(server: Server, body: dict, status: int, needle: str) -> None:
    with server.client() as c:
        r = c.post("/attention", json={"source": "en", "target": "ja", **body})
    assert r.status_code == status and needle in r.json()["error"], r.text


def test_a_list_is_held_against_the_memory_budget_as_a_whole(make_server: ServerFactory) -> None:
    server = make_server(memory_budget_mb=16)  # the text alone holds about 5 MiB
    body = {"source": "en", "target": "ja", "beam_size": 8, "max_length": 100}
    text = "Delete the selected files? Could not open the file."
    with server.client() as c:
        alone = c.post("/attention", json={**body, "q": text})
        many = c.post("/attention", json={**body, "q": [text] * 4})
    assert alone.status_code == 200, alone.text
    assert many.status_code == 413 and "memory_budget_mb=16" in many.json()["error"], many.text


def test_attention_gives_the_alignments_translate_gives(server: Server) -> None:
    body = {"q": "Could not open %s: permission denied", "source": "en", "target": "ja", "alignments": True}
    with server.client() as c:
        attention = c.post("/attention", json={**body, "kinds": ["cross"], "layers": [0]}).json()
        translation = c.post("/translate", json=body).json()
        bad = c.post("/attention", json={**body, "alignment_heads": [99]})
        without = c.post("/attention", json={**body, "alignments": False}).json()
    assert attention["translatedText"] == translation["translatedText"]
    assert attention["alignments"] == translation["alignments"] and attention["alignments"]
    assert bad.status_code == 422 and "alignment_heads" in bad.json()["error"]
    assert "alignments" not in without
