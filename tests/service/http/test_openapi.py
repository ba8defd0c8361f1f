"""The OpenAPI document lists the request bodies that the routes parse themselves, with working examples."""

from __future__ import annotations

from pathlib import Path

import orjson

from service.http.routes.attention import answer
from service.http.schemas import ATTENTION_EXAMPLES, AttentionResponse
from service.serving.engine import Engine
from service.serving.translation import Filters, Options
from service.settings import Settings
from tests.service.conftest import Server

SHIPPED = Path(__file__).resolve().parents[3] / "model" / "bundles" / "en-ja"


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


def test_attention_examples_are_answered_and_are_the_shipped_models_answers(server: Server) -> None:
    with server.client() as c:
        schema = c.get("/openapi.json").json()
        for example in schema["components"]["schemas"]["AttentionRequest"]["examples"]:
            assert c.post("/attention", json=example).status_code == 200, example
    assert schema["components"]["schemas"]["AttentionResponse"]["examples"] == ATTENTION_EXAMPLES
    engine = Engine.load(SHIPPED, Settings(bundles=[SHIPPED]))
    for text, example in zip(("Open file\n", "Open %s\nSave"), ATTENTION_EXAMPLES, strict=True):
        result = engine.attention_now([text], Options(), Filters(["cross"], [0], [0]))[0]
        assert orjson.loads(orjson.dumps(answer(result), option=orjson.OPT_SERIALIZE_NUMPY)) == example
        AttentionResponse.model_validate(example)
