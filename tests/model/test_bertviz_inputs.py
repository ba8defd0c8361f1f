"""model/bertviz_inputs.py against the real bertviz: /attention answers (one segment, and each segment of a text of
several) drawn by ``head_view`` and ``model_view``; docs/API.md quotes the function as it is."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bertviz import head_view, model_view

from model.bertviz_inputs import bertviz_inputs
from service.settings import Settings
from tests.service.conftest import Server

DOCS = Path(__file__).parents[2] / "docs" / "API.md"


def drawn(html: str) -> dict:
    """The parameters bertviz put into its page's script."""
    (params,) = re.findall(r"const params = (\{.*\}); // HACK", html)
    return dict(json.loads(params))


@pytest.fixture(scope="module")
def server(tiny_bundle: Path) -> Iterator[Server]:
    with Server(Settings(bundles=[tiny_bundle], max_wait_ms=5)) as s:
        yield s


def shown(tokens: list[str]) -> list[str]:
    """Tokens as bertviz shows them (SentencePiece's word marker as a space)."""
    return [t.replace("▁", " ") for t in tokens]


def test_the_docs_quote_the_function() -> None:
    assert inspect.getsource(bertviz_inputs) in DOCS.read_text()


@pytest.mark.parametrize("q", ["Delete the selected files?", "Open %s\nSave the file"])
def test_head_view_and_model_view_draw_an_answer(server: Server, q: str) -> None:
    with server.client() as c:
        r = c.post("/attention", json={"q": q, "source": "en", "target": "ja", "max_length": 6})
    assert r.status_code == 200, r.text
    answer = r.json()
    for entry in answer["segments"] if len(answer["segments"]) > 1 else [answer]:
        inputs = bertviz_inputs(entry)
        for kind in ("encoder", "decoder", "cross"):
            layers = inputs[f"{kind}_attention"]
            assert len(layers) == len(entry[kind]) and all(a.shape[0] == 1 for a in layers)
            np.testing.assert_array_equal(np.stack([a[0].numpy() for a in layers]), np.array(entry[kind], np.float32))
        for view in (head_view, model_view):
            html = view(**inputs, html_action="return").data
            params = drawn(html)
            names = [d["name"] for d in params["attention"]]
            assert names == ["Encoder", "Decoder", "Cross"], view
            cross = params["attention"][2]
            assert cross["left_text"] == shown(entry["decoder_input_tokens"])
            assert cross["right_text"] == shown(entry["source_tokens"])
            np.testing.assert_allclose(np.array(cross["attn"]), np.array(entry["cross"]), atol=1e-6)


def test_a_forced_prefix_gets_rows_of_zeros() -> None:
    T, P, S = 2, 1, 3
    answer = {
        "source_tokens": ["▁a", "▁b", "</s>"],
        "target_tokens": ["▁x", "</s>"],
        "decoder_input_tokens": ["<s>", "__ja__", "▁x"],
        "decoder": np.ones((1, 2, T, P + T)).tolist(),
        "cross": np.full((1, 2, T, S), 1 / S).tolist(),
    }
    inputs = bertviz_inputs(answer)
    assert [a.shape for a in inputs["decoder_attention"]] == [(1, 2, P + T, P + T)]
    assert [a.shape for a in inputs["cross_attention"]] == [(1, 2, P + T, S)]
    assert float(inputs["cross_attention"][0][0, :, :P].abs().sum()) == 0.0 and "encoder_attention" not in inputs
    assert "Decoder" in head_view(**inputs, html_action="return").data
