"""POST /translate against a real uvicorn on loopback, with a tiny random bundle."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from service.cli.main import main
from service.runtime.bundle import Tokenizer, load_bundle
from tests.service.conftest import Server, ServerFactory, assert_loading

OK = {"q": "Open file", "source": "en", "target": "ja"}
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
    assert auto.json()["detectedLanguage"]["language"] == "en"  # detected (tests/service/http/routes/test_detect.py)


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


def test_a_caller_that_went_away_frees_its_rows(make_server: ServerFactory) -> None:
    server = make_server(max_batch_size=1, max_wait_ms=0)  # one text at a time: far longer than the 0.3 s timeout
    body = {**OK, "q": ["Delete the selected files?"] * 48, "max_length": 250}  # random weights: no early </s>

    def busy() -> float:
        """Rows being decoded and texts queued: between two texts no row is active, but the queue is not empty."""
        with server.client() as c:
            lines = c.get("/metrics").text.splitlines()
        gauges = ("attnserve_active_sequences{", "attnserve_queue_depth{")
        return sum(float(ln.split()[1]) for ln in lines if ln.startswith(gauges))

    with pytest.raises(httpx.ReadTimeout), server.client(timeout=0.3) as c:
        c.post("/translate", json=body)
    for _ in range(100):  # the route looks for the disconnect after 1 s, then 2 s later
        if busy() == 0:
            break
        time.sleep(0.05)
    assert busy() == 0
    with server.client() as c:
        assert c.post("/translate", json=OK).status_code == 200


@pytest.mark.parametrize("source", ["auto", "en"])
@pytest.mark.parametrize("form", ["text", "html"])
def test_translate_is_503_while_the_models_load(loading_server: Server, source: str, form: str) -> None:
    with loading_server.client() as c:
        assert_loading(c.post("/translate", json={**OK, "source": source, "format": form}))


RAW = ["Open %s at https://example.com 42 times", "  Delete the selected files?\nSettings  ", ""]


def test_raw_texts_go_to_the_model_as_given(make_server: ServerFactory, tiny_bundle: Path) -> None:
    """Whole texts, edge whitespace and line breaks included, nothing masked: the pieces of the whole text; the
    answer is the decoded tokens' text, and a text without raw (the response cache on) is answered apart."""
    tok = load_bundle(tiny_bundle).tokenizer
    server = make_server(cache_mb=1)
    with server.client() as c:
        raw = c.post("/translate", json={"q": RAW, "source": "en", "target": "ja", "raw": True, "return_details": True})
        masked = c.post("/translate", json={"q": RAW[0], "source": "en", "target": "ja", "return_details": True})
        again = c.post("/translate", json={"q": RAW[0], "source": "en", "target": "ja", "raw": True})
    assert raw.status_code == 200, raw.text
    details = raw.json()["details"]
    assert [d["source_tokens"] for d in details] == [tok.pieces(tok.encode_source(t)) for t in RAW]
    assert raw.json()["translatedText"] == [tok.decode(_ids(tok, d)) for d in details]
    masked_pieces = "".join(masked.json()["details"]["source_tokens"])
    assert "{0}" in masked_pieces and "%" not in masked_pieces  # without raw the printf form is masked
    assert again.json()["translatedText"] == raw.json()["translatedText"][0]


def _ids(tok: Tokenizer, details: dict) -> list[int]:
    ids = {piece: i for i, piece in tok.pieces_by_id.items()}
    return [ids[p] for p in details["tokens"]]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [({"glossary": {"file": "ファイル"}}, "glossary"), ({"keep": ["file"]}, "keep"), ({"format": "html"}, "html")],
)
def test_raw_refuses_what_needs_the_text_changed(server: Server, extra: dict, needle: str) -> None:
    with server.client() as c:
        r = c.post("/translate", json={**OK, "raw": True, **extra})
    assert r.status_code == 422 and "raw" in r.json()["error"] and needle in r.json()["error"], r.text


def test_alignments_are_word_spans_of_the_text_and_its_translation(server: Server) -> None:
    body = {"source": "en", "target": "ja", "alignments": True}
    with server.client() as c:
        one = c.post("/translate", json={**body, "q": TEXTS[3]}).json()
        many = c.post("/translate", json={**body, "q": TEXTS}).json()
        chosen = c.post("/translate", json={**body, "q": TEXTS[3], "alignment_layer": 0, "alignment_heads": [1]})
        plain = c.post("/translate", json={"q": TEXTS[3], "source": "en", "target": "ja"}).json()
        page = c.post("/translate", json={**body, "q": "<p>Open file</p>", "format": "html"}).json()
    assert "alignments" not in plain and page["alignments"] is None
    assert many["alignments"][3] == one["alignments"] and len(many["alignments"]) == len(TEXTS)
    assert chosen.status_code == 200 and isinstance(chosen.json()["alignments"], list)
    translation = one["translatedText"]
    assert one["alignments"]
    for link in one["alignments"]:
        (a, b), (c_, d) = link["source"], link["target"]
        assert 0 <= a < b <= len(TEXTS[3]) and 0 <= c_ < d <= len(translation)
        assert TEXTS[3][a:b].strip() == TEXTS[3][a:b] and translation[c_:d].strip() == translation[c_:d]


@pytest.mark.parametrize(
    ("extra", "named"), [({"alignment_layer": 5}, "alignment_layer 5"), ({"alignment_heads": [9]}, "alignment_heads")]
)
def test_an_alignment_layer_or_head_the_model_lacks_is_a_422(server: Server, extra: dict, named: str) -> None:
    with server.client() as c:
        r = c.post("/translate", json={**OK, "alignments": True, **extra})
    assert r.status_code == 422 and named in r.json()["error"]
