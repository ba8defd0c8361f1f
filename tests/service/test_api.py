"""The HTTP API against a real uvicorn on loopback, with a tiny random bundle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from service.api import distinct
from service.bundle import load_bundle
from service.cli import main
from tests.service.conftest import Server

TEXTS = ["Open file", "Settings", "Delete the selected files?", "Could not open %s: permission denied"]


def test_translate_equals_the_command_line(server: Server, tiny_bundle: Path, capsys: pytest.CaptureFixture) -> None:
    with server.client() as c:
        r = c.post("/translate", json={"q": TEXTS, "source": "en", "target": "ja"})
    assert r.status_code == 200, r.text
    assert main(["translate", "--bundle", str(tiny_bundle), "--json", *TEXTS]) == 0
    assert r.json()["translatedText"] == json.loads(capsys.readouterr().out)


def test_lists_keep_order_and_single_text_gives_a_string(server: Server) -> None:
    with server.client() as c:
        many = c.post("/translate", json={"q": TEXTS, "source": "en", "target": "ja"}).json()["translatedText"]
        ones = [c.post("/translate", json={"q": t, "source": "en", "target": "ja"}).json() for t in TEXTS]
        reversed_ = c.post("/translate", json={"q": TEXTS[::-1], "source": "en", "target": "ja"}).json()
    assert all(isinstance(o["translatedText"], str) for o in ones)
    assert many == [o["translatedText"] for o in ones]
    assert reversed_["translatedText"] == many[::-1]


def test_form_encoded_and_auto_source(server: Server) -> None:
    with server.client() as c:
        form = c.post("/translate", data={"q": TEXTS[0], "source": "en", "target": "ja"})
        auto = c.post("/translate", json={"q": TEXTS[0], "source": "auto", "target": "ja"})
        json_ = c.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "ja"})
    assert form.status_code == 200, form.text
    assert form.json()["translatedText"] == json_.json()["translatedText"] == auto.json()["translatedText"]
    assert auto.json()["detectedLanguage"] == {"confidence": 100, "language": "en"}


def test_alternatives_and_details(server: Server) -> None:
    with server.client() as c:
        r = c.post(
            "/translate",
            json={"q": TEXTS[0], "source": "en", "target": "ja", "alternatives": 2, "return_details": True},
        ).json()
    alternatives = r["alternatives"]
    assert 0 < len(alternatives) <= 2 and len(set(alternatives)) == len(alternatives)
    assert r["translatedText"] not in alternatives
    d = r["details"]
    assert d["source_tokens"][-1] == "</s>"
    assert len(d["tokens"]) == len(d["token_scores"]) == len(d["alignment"])
    assert all(0 <= a < len(d["source_tokens"]) for a in d["alignment"])
    with server.client() as c:  # greedy, where scores are computed only when details are asked for
        greedy = c.post("/translate", json={"q": TEXTS[0], "source": "en", "target": "ja", "return_details": True})
    g = greedy.json()["details"]
    assert all(-1e9 < x <= 0 for x in g["token_scores"]) and g["score"] == pytest.approx(sum(g["token_scores"]))


def test_alternatives_skip_texts_already_given() -> None:
    assert distinct(["a", "a", "b", "a", "b", "c", "d"], 2) == ["b", "c"]
    assert distinct(["a", "a", "a"], 2) == []
    assert distinct(["a"], 1) == []


def test_languages_in_libretranslate_shape(server: Server) -> None:
    with server.client() as c:
        assert c.get("/languages").json() == [{"code": "en", "name": "English", "targets": ["ja"]}]


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


def test_openapi_documents_the_request_bodies_with_examples(server: Server) -> None:
    with server.client() as c:
        schema = c.get("/openapi.json").json()
    for name, path in (("TranslateRequest", "/translate"), ("AttentionRequest", "/attention")):
        assert schema["components"]["schemas"][name]["examples"], name
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{name}"}
    with server.client() as c:
        for example in schema["components"]["schemas"]["TranslateRequest"]["examples"]:
            assert c.post("/translate", json=example).status_code == 200, example
