"""The engine around a fake runner (numpy, no ONNX): texts in, translations out, and its errors as HTTP answers."""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.decoding import DecodeRequest, DecodeResult, decode
from service.errors import NoSuchIndex, TooLarge, UnknownPair
from service.http import errors
from service.runtime.bundle import ModelSpec, load_bundle
from service.runtime.manifest import Manifest
from service.runtime.runner import AppendedRunner, open_runner
from service.runtime.runner import Runner as OnnxRunner
from service.serving.budget import BudgetFull, MiB
from service.serving.catalog import served_graphs
from service.serving.engine import Engine, Pooled, Runners
from service.serving.on_first_use import OnFirstUse
from service.serving.translation import Filters, Options, Translation, distinct
from service.settings import Settings
from tests.service.fake_runner import SPEC, CountingRunner, expected


class Runner(CountingRunner):
    """The scheduler tests' runner, with no attention outputs (as the fast decoder)."""

    attention = False
    provider = "fake"


class Tokenizer:
    """A word is one token: its length + 1 (ids 2..14); </s> (0) ends a source."""

    target_prefix: tuple[int, ...] = ()

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
    manifest: Manifest = field(default_factory=Manifest)  # no calibration
    targets: dict[str, list[int]] = field(default_factory=lambda: {"ja": []})

    def served_variant(self, override: str | None) -> str:
        return override or self.manifest.default_variant


def fake_engine(bundle: Bundle | None = None, **settings: Any) -> Engine:
    runner = Runner()
    return Engine(bundle or Bundle(), Settings(max_wait_ms=1, **settings), Runners(runner, runner))  # type: ignore[arg-type]


def test_each_target_opens_its_sources_with_its_prefix() -> None:
    engine = fake_engine(Bundle(targets={"es": [7], "pt": [8]}))
    plain = fake_engine()._request("Open the file", Options(), False).src
    assert (engine.pair, engine._request("Open the file", Options(), False).src) == (("en", "es"), [7, *plain])
    other = engine.for_target("pt")
    assert (other.pair, other._request("Open the file", Options(), False).src) == (("en", "pt"), [8, *plain])
    assert other.schedulers is engine.schedulers and other.runners is engine.runners
    assert [e.pair for e in engine.for_targets()] == [("en", "es"), ("en", "pt")]
    with pytest.raises(UnknownPair, match="not de"):
        engine.for_target("de")


def test_the_engines_of_a_process_share_one_memory_budget_and_one_cache() -> None:
    """memory_budget_mb and cache_mb bound the process, not each bundle: a hold on one engine's budget makes another
    bundle's request wait, and both bundles' translations fill one cache (each under its own engine's key)."""
    settings = Settings(max_wait_ms=1, cache_mb=1, memory_budget_mb=16, request_timeout_s=0.2)
    pooled = Pooled.of(settings)
    ja, de = (Engine(Bundle(name=f"fake-en-{t}", targets={t: []}), settings, Runners(Runner(), Runner()), pooled=pooled)  # type: ignore[arg-type]
              for t in ("ja", "de"))  # fmt: skip
    assert ja.budget is de.budget and ja.budget.capacity == 16 * MiB
    assert ja.cache is de.cache and ja.cache is not None and ja.cache.capacity == 1 * MiB

    async def served() -> None:
        await ja.start()
        await de.start()
        try:
            first = await ja.translate(["Open the file"], Options())
            assert await ja.translate(["Open the file"], Options()) == first  # from the cache
            await de.translate(["Open the file"], Options())  # the same text, another engine: decoded, not ja's
            assert ja.cache is not None and (len(ja.cache), ja.cache.hits, ja.cache.misses) == (2, 1, 2)
            async with ja.budget.hold(ja.budget.capacity, time.monotonic() + 5):
                with pytest.raises(BudgetFull):
                    await de.translate(["Settings"], Options())
        finally:
            await ja.stop()
            await de.stop()

    asyncio.run(served())


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
        await engine.attention(["a"], Options(), Filters(heads=[5]))

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
        engine.attention_now(["a"], Options(), Filters(layers=[1]))


def test_alternatives_skip_texts_already_given() -> None:
    assert distinct(["a", "a", "b", "a", "b", "c", "d"], 2) == ["b", "c"]
    assert distinct(["a", "a", "a"], 2) == []
    assert distinct(["a"], 1) == []


def without_forced_decoder(bundle: Path, tmp_path: Path) -> Path:
    """A copy of ``bundle`` as exported before the forced decoder: no decoder.forced.onnx in it or its manifest."""
    copy = Path(shutil.copytree(bundle, tmp_path / "no-forced"))
    manifest = Manifest.read(copy)
    del manifest.graphs["forced_decoder"], manifest.graph_forms["decoder.forced.onnx"]
    (copy / "decoder.forced.onnx").unlink()
    manifest.write_with_checksums(copy)
    return copy


def recorded_decodes(engine: Engine) -> list[list[DecodeRequest]]:
    """The requests of each of the engine's ``_decode_now`` calls, from now on."""
    calls: list[list[DecodeRequest]] = []
    decode_now = engine._decode_now

    def recorded(requests: list[DecodeRequest], exact: bool) -> list[DecodeResult]:
        calls.append(requests)
        return decode_now(requests, exact)

    engine._decode_now = recorded  # type: ignore[method-assign]
    return calls


SPAN_TEXTS = ["Open %s now", "Save as", "Close {name}"]


def test_span_texts_decode_on_the_fast_graphs_and_only_unplaced_ones_again(tiny_bundle: Path, tmp_path: Path) -> None:
    engine = Engine.load(without_forced_decoder(tiny_bundle, tmp_path), Settings(bundles=[tiny_bundle]))
    assert engine.runners.forced is None
    calls = recorded_decodes(engine)
    out = engine.translate_now(SPAN_TEXTS, Options())
    # The random model copies no stand-in. "Close {name}" is whole wherever its span goes: it decodes again with
    # attention rows to place it. "Open %s now" is broken before any placement: it decodes constrained first, and
    # with attention only once that fails too (test_restoring.py).
    first, again, *recovering = [c for c in calls if not any(r.constraint for r in c)]
    assert not any(r.attention for r in first)
    assert [r.src for r in again] == [first[2].src] and all(r.attention for r in again)
    constrained = next(i for i, c in enumerate(calls) if any(r.constraint for r in c))
    assert calls.index(again) < constrained and all(calls.index(c) > constrained for c in recovering)
    assert [r.src for c in recovering for r in c] in ([], [first[0].src])
    assert "%s" in out[0].text and "{name}" in out[2].text

    # With a forced decoder the second decode is gone: one forced call gives the unplaced rows their attention,
    # the fast graphs' tokens are kept, and the spans land where the decode with attention rows put them.
    forced_engine = Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle]))
    assert forced_engine.runners.forced is forced_engine.runners.exact
    forced_calls = recorded_decodes(forced_engine)
    cross_attention = forced_engine.runners.forced.cross_attention
    sources: list[list[list[int]]] = []

    def counted(srcs: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]:
        sources.append(srcs)
        return cross_attention(srcs, targets)

    with patch.object(forced_engine.runners.forced, "cross_attention", counted):
        assert forced_engine.translate_now(SPAN_TEXTS, Options()) == out
        calls = len(sources)  # the first decode's unplaced rows, then a constrained re-decode's, if any
        assert sources[0] == [first[2].src]
        unconstrained = [c for c in forced_calls if not any(r.constraint for r in c)]
        assert len(unconstrained) == 1 and not any(r.attention for r in unconstrained[0])

        async def served() -> list[Translation]:
            await forced_engine.start()
            try:
                return await forced_engine.translate(SPAN_TEXTS, Options())
            finally:
                await forced_engine.stop()

        assert asyncio.run(served()) == out
        assert len(sources) == 2 * calls


def with_target_prefix(bundle: Path, tmp_path: Path, prefix: list[int]) -> Path:
    """A copy of ``bundle`` whose manifest says every target starts with ``prefix`` (as an imported Argos
    package's ``target_prefix``)."""
    copy = Path(shutil.copytree(bundle, tmp_path / "prefixed"))
    manifest = Manifest.read(copy)
    manifest.tokenizer["target_prefix"] = prefix
    manifest.write(copy)
    return copy


def test_a_target_prefix_is_forced_and_left_out_of_every_answer(tiny_bundle: Path, tmp_path: Path) -> None:
    """Translations are the decoder's with the prefix forced and its tokens left out; spans placed from the forced
    decoder's cross-attention land where a decode with attention rows puts them; /attention's decoder keys start
    with the prefix."""
    bundle = with_target_prefix(tiny_bundle, tmp_path, [7])
    engine = Engine.load(bundle, Settings(bundles=[bundle]))
    plain = Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle]))
    texts = ["Open the file", "Settings", "Delete the selected files now", *SPAN_TEXTS]
    out = engine.translate_now(texts, Options())
    requests = [engine._request(t, Options(), False) for t in texts[:3]]
    assert all(r.prefix == (7,) for r in requests)
    results = decode(engine.runners.exact, requests)
    assert [t.text for t in out[:3]] == [engine.tokenizer.decode(r.hypotheses[0].tokens) for r in results]
    assert [t.text for t in out] != [t.text for t in plain.translate_now(texts, Options())]

    again = Engine.load(without_forced_decoder(bundle, tmp_path), Settings(bundles=[bundle]))
    assert again.runners.forced is None and engine.runners.forced is not None
    assert again.translate_now(texts, Options()) == out

    result = engine.attention_now(["Open the file"], Options(), Filters())[0]
    (segment,) = result.segments
    T, start = len(segment.target_tokens), engine.tokenizer.pieces([engine.bundle.spec.decoder_start_id])
    assert segment.decoder_input_tokens[:2] == start + engine.tokenizer.pieces([7])
    assert len(segment.decoder_input_tokens) == T + 1
    assert segment.weights["decoder"].shape[2:] == (T, T + 1)
    np.testing.assert_allclose(segment.weights["decoder"].sum(axis=-1), 1, atol=1e-5)
    assert result.text == out[0].text


def test_a_device_decoder_leaves_forced_and_constrained_requests_to_the_exact_runner(tiny_bundle: Path) -> None:
    """/translate on a device decoder (as on CUDA, here on the CPU): its texts decode there, but for those that read
    every logit (a constrained re-decode of a broken span) or want attention rows, which go to the exact runner; the
    answers are the CPU fast decoder's."""
    bundle = load_bundle(tiny_bundle)
    exact = AppendedRunner(bundle, "cpu")
    device = open_runner(bundle, "cpu", role="device_decoder", encoder=exact.encoder)
    engine = Engine(bundle, Settings(bundles=[tiny_bundle]), Runners(exact, device, exact))
    served: list[tuple[str, list[DecodeRequest]]] = []

    def recorded(runner: OnnxRunner, requests: list[DecodeRequest]) -> list[DecodeResult]:
        served.append(("exact" if runner is exact else "device", requests))
        return decode(runner, requests)

    with patch("service.serving.engine.decode", recorded):
        out = engine.translate_now([*SPAN_TEXTS, "Delete the selected files?"], Options())
    kinds = {(name, r.constraint is not None, r.attention, r.forced is not None) for name, rs in served for r in rs}
    assert ("device", False, False, False) in kinds and ("exact", True, False, False) in kinds
    assert all(name == "exact" for name, c, a, f in kinds if c or a or f)
    assert out == Engine.load(tiny_bundle, Settings(bundles=[tiny_bundle])).translate_now(
        [*SPAN_TEXTS, "Delete the selected files?"], Options()
    )


LIBRETRANSLATE = '{"en-de": {"beam_size": 4, "length_penalty": 0.2}}'


def decoded_with(engine: Engine, options: Options) -> tuple[int, float]:
    request = engine._request("Open the file", options, False)
    return request.beam_size, request.length_penalty


def test_a_request_naming_no_decoding_gets_the_pairs_defaults_then_the_global_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert decoded_with(fake_engine(), Options()) == (1, 1.0)  # unset: greedy, no penalty
    monkeypatch.setenv("ATTNSERVE_DEFAULT_BEAM_SIZE", "2")
    monkeypatch.setenv("ATTNSERVE_DEFAULT_LENGTH_PENALTY", "0.6")
    monkeypatch.setenv("ATTNSERVE_PAIR_DEFAULTS", LIBRETRANSLATE)
    bundle = Bundle(targets={"de": [], "ja": []})
    de, ja = fake_engine(bundle).for_targets()
    assert (de.pair, decoded_with(de, Options())) == (("en", "de"), (4, 0.2))  # the pair's
    assert (ja.pair, decoded_with(ja, Options())) == (("en", "ja"), (2, 0.6))  # the global ones
    assert decoded_with(de, Options(beam_size=1)) == (1, 0.2)  # the request's own, field by field
    assert decoded_with(de, Options(length_penalty=1.0, alternatives=5)) == (6, 1.0)  # widened for alternatives


def test_a_pair_entry_may_set_one_field_and_the_global_gives_the_other() -> None:
    engine = fake_engine(pair_defaults={"en-ja": {"length_penalty": 0.2}}, default_beam_size=3)
    assert decoded_with(engine, Options()) == (3, 0.2)


def session_files(*runners: OnnxRunner) -> list[str]:
    """The graph files of the runners' sessions, each session once."""
    sessions = {id(s): s for r in runners for s in (r.encoder, r.decoder, getattr(r, "forced", None)) if s is not None}
    return sorted(Path(s._model_path).name for s in sessions.values())


@pytest.mark.parametrize("variant", ["float32", "int8"])
def test_the_exact_graphs_open_on_first_need_and_the_sessions_are_those_counted(
    tiny_int8_bundle: Path, variant: str
) -> None:
    """On the CPU a bundle opens the graphs it serves (catalog.served_graphs without the exact ones), warm-up and
    plain translations included; the first /attention opens the exact graphs, float32's sharing the encoder
    session; what the engine read of the exact runner before is what it gives."""
    bundle = load_bundle(tiny_int8_bundle)
    settings = Settings(bundles=[tiny_int8_bundle], graph_variant=variant, provider="cpu")  # type: ignore[arg-type]
    runners = Runners.build(bundle, settings)
    exact, fast = runners.exact, runners.fast
    assert isinstance(exact, OnFirstUse) and isinstance(fast, OnnxRunner) and runners.forced is exact
    engine = Engine(bundle, settings, runners)
    engine.warm_up()
    engine.translate_now(["Open the file", "Settings"], Options())
    assert not exact.loaded
    assert session_files(fast) == sorted(served_graphs(bundle.manifest, variant, exact=False))

    engine.attention_now(["Open the file"], Options(), Filters())
    assert exact.loaded
    assert session_files(fast, exact.runner) == sorted(served_graphs(bundle.manifest, variant))
    assert (exact.runner.encoder is fast.encoder) == (variant == "float32")
    opened = exact.runner
    assert (exact.spec, exact.form, exact.attention, exact.provider, exact.has_forced) == (
        opened.spec,
        opened.form,
        opened.attention,
        opened.provider,
        opened.has_forced,
    )
    assert type(exact.tensors) is type(opened.tensors)
