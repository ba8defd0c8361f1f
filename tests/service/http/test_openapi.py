"""The OpenAPI document lists the request bodies that the routes parse themselves, with working examples."""

from __future__ import annotations

from tests.service.conftest import Server


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
