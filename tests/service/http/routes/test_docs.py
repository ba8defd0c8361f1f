"""/docs and /redoc work offline: the pages reference only the service's own assets, which it serves."""

from __future__ import annotations

import re

from tests.service.conftest import Server

URL = re.compile(r"""(?:src|href|spec-url)=["']([^"']+)["']|url:\s*'([^']+)'""")


def test_docs_pages_load_everything_from_the_service(server: Server) -> None:
    with server.client() as c:
        for page in ("/docs", "/redoc"):
            r = c.get(page)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            assert "http://" not in r.text and "https://" not in r.text and "//cdn" not in r.text, page
            urls = [a or b for a, b in URL.findall(r.text)]
            assert any(u.endswith(".js") for u in urls) and "/openapi.json" in urls, urls
            for url in urls:
                asset = c.get(url)
                assert asset.status_code == 200 and len(asset.content) > 1000, url
        assert "SwaggerUIBundle" in c.get("/docs/assets/swagger-ui-bundle.js").text
        assert c.get("/docs/oauth2-redirect").status_code == 200


def test_only_the_named_assets_are_served(server: Server) -> None:
    with server.client() as c:
        for name in ("core.py", "..%2F__init__.py", "%2e%2e%2fcore.py", "LICENSE"):
            r = c.get(f"/docs/assets/{name}")
            assert r.status_code == 404 and "error" in r.json(), name
