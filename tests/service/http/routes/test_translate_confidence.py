"""POST /translate with return_details: confidence, flags and coverage over HTTP, with a calibrated tiny bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.settings import Settings
from tests.service.conftest import Server
from tests.service.serving.test_confidence import entry

BODY = {"source": "en", "target": "ja", "return_details": True}


def test_details_say_how_sure(tiny_bundle: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "calibration": entry()}))
    with Server(Settings(bundles=[path], max_wait_ms=1)) as server, server.client() as c:
        many = c.post("/translate", json={**BODY, "q": ["Open file", "Settings"]}).json()["details"]
        plain = c.post("/translate", json={**BODY, "q": "Open file", "return_details": False}).json()
        schema = c.get("/openapi.json").json()["components"]["schemas"]["TranslateResponse"]
    for d in many:
        assert d["confidence"] == pytest.approx(min(1, max(0, 1 + sum(d["token_scores"]) / len(d["tokens"]) / 10)))
        assert len(d["coverage"]) == len(d["source_tokens"]) and all(0 <= x <= 1 for x in d["coverage"])
        assert isinstance(d["flags"], list) and set(d["flags"]) <= {"omission", "copy"}
    assert "details" not in plain
    example = schema["properties"]["details"]["examples"][0]
    assert {"confidence", "flags", "coverage"} <= set(example)


def test_without_calibration_confidence_is_null(server: Server) -> None:
    with server.client() as c:
        d = c.post("/translate", json={**BODY, "q": "Open file"}).json()["details"]
    assert d["confidence"] is None and isinstance(d["flags"], list)
