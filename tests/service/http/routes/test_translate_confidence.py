"""POST /translate with return_details: confidence, flags and coverage over HTTP, with a calibrated tiny bundle."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from service.runtime.manifest import Manifest
from service.settings import Settings
from tests.service.conftest import Server
from tests.service.serving.test_confidence import entry

BODY = {"source": "en", "target": "ja", "return_details": True}


def test_details_say_how_sure(tiny_bundle: Path, tmp_path: Path) -> None:
    path = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = Manifest.read(path)
    manifest.calibration = entry()
    manifest.write(path)
    with Server(Settings(bundles=[path], max_wait_ms=1)) as server, server.client() as c:
        many = c.post("/translate", json={**BODY, "q": ["Open file", "Settings"]}).json()["details"]
        plain = c.post("/translate", json={**BODY, "q": "Open file", "return_details": False}).json()
        schema = c.get("/openapi.json").json()["components"]["schemas"]["TranslateResponse"]
    for d in many:
        assert d["confidence"] == pytest.approx(min(1, max(0, 1 + sum(d["token_scores"]) / len(d["tokens"]) / 10)))
        assert len(d["coverage"]) == len(d["source_tokens"]) and all(0 <= x <= 1 for x in d["coverage"])
        assert isinstance(d["flags"], list) and set(d["flags"]) <= {"omission", "copy", "repetition"}
        assert d["spans"] is None  # no protected span
    assert "details" not in plain
    plain_example, span_example = schema["properties"]["details"]["examples"]
    assert {"confidence", "flags", "coverage"} <= set(plain_example) and span_example["spans"] == "decoded"


def test_details_say_how_spans_were_restored(server: Server) -> None:
    with server.client() as c:
        d = c.post("/translate", json={**BODY, "q": "Open %s now"}).json()["details"]
        text = c.post("/translate", json={**BODY, "q": "Open %s now"}).json()["translatedText"]
        metrics = c.get("/metrics").text
    assert d["spans"] in ("decoded", "constrained", "attention", "appended")
    assert text.count("%s") == 1 and "{" not in text and "}" not in text
    counted = [ln for ln in metrics.splitlines() if ln.startswith("attnserve_span_segments_total{")]
    assert len(counted) == 4 and sum(float(ln.split()[-1]) for ln in counted) == 2.0


def test_without_calibration_confidence_is_null(server: Server) -> None:
    with server.client() as c:
        d = c.post("/translate", json={**BODY, "q": "Open file"}).json()["details"]
    assert d["confidence"] is None and isinstance(d["flags"], list)
