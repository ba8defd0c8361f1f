"""The engine around a fake runner (numpy, no ONNX): texts in, translations out, and its errors as HTTP answers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.bundle import ModelSpec
from service.engine import Engine, Filters, Options, Runners, Translation, distinct
from service.errors import NoSuchIndex, TooLarge
from service.http import errors
from service.settings import Settings
from tests.service.fake_runner import SPEC, CountingRunner, expected


class Runner(CountingRunner):
    """The scheduler tests' runner, with no attention outputs (as the fast decoder)."""

    attention = False
    provider = "fake"


class Tokenizer:
    """A word is one token: its length + 1 (ids 2..14); </s> (0) ends a source."""

    def encode_source(self, text: str) -> list[int]:
        return [min(len(w), 13) + 1 for w in text.split()] + [SPEC.eos_id]

    def encode_target(self, text: str) -> list[int]:
        return self.encode_source(text)

    def pieces(self, ids: list[int]) -> list[str]:
        return [str(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids if i != SPEC.eos_id)


@dataclass
class Bundle:
    spec: ModelSpec = SPEC
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    name: str = "fake"
    source_lang: str = "en"
    target_lang: str = "ja"
    manifest: dict[str, Any] = field(default_factory=dict)  # no calibration


def fake_engine(**settings: Any) -> Engine:
    runner = Runner()
    return Engine(Bundle(), Settings(max_wait_ms=1, **settings), Runners(runner, runner))  # type: ignore[arg-type]


def test_translate_through_the_schedulers_equals_decoding_now() -> None:
    engine = fake_engine()
    texts = ["Open the file", "Settings", "Delete the selected files now"]

    async def served() -> list[Translation]:
        await engine.start()
        try:
            return await engine.translate(texts, Options())
        finally:
            await engine.stop()

    translations = asyncio.run(served())
    tokenizer = Tokenizer()
    want = [tokenizer.decode(expected(tokenizer.encode_source(t))) for t in texts]
    assert [t.text for t in translations] == want
    assert all(t.alternatives == [] and t.details is None for t in translations)
    assert engine.translate_now(texts, Options()) == translations


def test_domain_errors_become_their_status_codes() -> None:
    engine = fake_engine(max_chars=10)
    app = FastAPI()
    errors.install(app, lambda: None)

    @app.post("/translate")
    async def translate() -> None:
        await engine.translate(["a" * 11], Options())

    @app.post("/attention")
    async def attention() -> None:
        await engine.attention("a", Options(), Filters(heads=[5]))

    with TestClient(app) as c:
        too_large, no_head = c.post("/translate"), c.post("/attention")
    assert too_large.status_code == 413
    assert too_large.json() == {"error": "a text has 11 characters; the limit is max_chars=10"}
    assert no_head.status_code == 422
    assert no_head.json() == {"error": "heads [5] do not exist: the model has heads 0..1"}


def test_limits_name_their_setting() -> None:
    engine = fake_engine(max_chars=10)
    with pytest.raises(TooLarge) as e:
        engine.translate_now(["a" * 11], Options())
    assert (e.value.field, e.value.limit) == ("max_chars", 10)
    with pytest.raises(NoSuchIndex, match="layers"):
        engine.attention_now("a", Options(), Filters(layers=[1]))


def test_alternatives_skip_texts_already_given() -> None:
    assert distinct(["a", "a", "b", "a", "b", "c", "d"], 2) == ["b", "c"]
    assert distinct(["a", "a", "a"], 2) == []
    assert distinct(["a"], 1) == []
