"""The runner's caches: IOBinding (device values, the CUDA path, run here on the CPU) changes no answer."""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import onnxruntime as ort
import pytest

from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, decode, pack
from service.decoding.batch import Batch
from service.decoding.caches import Caches
from service.decoding.greedy_choice import GreedyChoice
from service.decoding.in_place import DeviceInPlaceCaches
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.providers import CPU
from service.runtime.runner import AppendedRunner, InPlaceRunner, Runner, open_runner, tune_memory
from service.runtime.tensors import DeviceTensors, HostTensors


def test_device_tensors_equal_numpy() -> None:
    host, device = HostTensors(), DeviceTensors([CPU], "cpu", ort.SessionOptions())
    x = np.random.default_rng(0).standard_normal((5, 2, 3, 4)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((2, 2, 3, 4)).astype(np.float32)
    on = lambda a: ort.OrtValue.ortvalue_from_numpy(a, "cpu", 0)  # noqa: E731
    rows = np.array([4, 0, 0, 2])
    cases = [
        (host.take(x, rows), device.take(on(x), rows)),
        (host.cat(x, y), device.cat(on(x), on(y))),
        (host.pad(x, 2, 3), device.pad(on(x), 2, 3)),
        (host.pad(x, 0, 2), device.pad(on(x), 0, 2)),
        (host.pad(x, 2, 2, front=True), device.pad(on(x), 2, 2, front=True)),
        (host.narrow(x, 2, 1, 3), device.narrow(on(x), 2, 1, 3)),
        (host.pad(host.empty((0, 2, 0, 4)), 2, 3), device.pad(device.empty((0, 2, 0, 4)), 2, 3)),
        (host.put(x.copy(), np.array([3, 1]), y), device.put(on(x), np.array([3, 1]), on(y))),
        (host.put(x.copy(), np.array([4, 0]), y[:, :, :1]), device.put(on(x), np.array([4, 0]), on(y[:, :, :1]))),
    ]
    for expected, got in cases:
        assert device.shape(got) == host.shape(expected)
        np.testing.assert_array_equal(got.numpy(), expected)
    np.testing.assert_array_equal(host.pad(x, 2, 2, front=True)[:, :, 2:], x)
    shorter = host.put(x.copy(), np.array([4, 0]), y[:, :, :1])  # the rest of the rows' axis 2 becomes zeros
    np.testing.assert_array_equal(shorter[[4, 0]], host.pad(y[:, :, :1], 2, 2))
    assert host.take(x, rows).flags.c_contiguous and host.narrow(x, 2, 1, 3).flags.c_contiguous


TEXTS = ["Print the document in this window now", "Delete the selected files?", "Open", "Save as", "Close"]
TEXTS += ["Open file", "Settings", "Replace the file in this window?"]


def requests_of(bundle: Bundle, beams: list[int], lengths: list[int], **options: Any) -> list[DecodeRequest]:
    """One request a text of TEXTS: its beam size (and as many hypotheses) and max_length; ``options`` for all."""
    tok = bundle.tokenizer
    return [
        DecodeRequest(src=tok.encode_source(t), beam_size=b, max_length=n, n_best=b, **options)
        for t, b, n in zip(TEXTS, beams, lengths, strict=True)
    ]


def staggered(runner: Runner, requests: list[DecodeRequest]) -> tuple[list[DecodeResult], Counter[str]]:
    """The first two requests together, then one more each time one finishes: rows join (into the holes that
    finished ones left, or at the end), reorder (beams), leave, get trimmed, and move from the young batch to the
    old one (age 2). Returns the results and how often the batches filled holes, split and absorbed rows."""
    calls: Counter[str] = Counter()

    def counted(owner: type, name: str) -> Any:
        method = getattr(owner, name)

        def wrapper(*args: Any) -> Any:
            calls[name] += 1
            return method(*args)

        return wrapper

    with ExitStack() as stack:
        for owner, name in ((Caches, "fill"), (Batch, "split"), (Batch, "absorb")):
            stack.enter_context(patch.object(owner, name, counted(owner, name)))
        decoder = BatchDecoder(runner, age=2)
        decoder.admit([(0, requests[0]), (1, requests[1])])
        results: dict[int, DecodeResult] = {}
        pending = list(enumerate(requests))[2:]
        while decoder.num_rows:
            done, _ = decoder.step()
            results.update((int(k), r) for k, r in done)  # type: ignore[call-overload]
            for _ in done:
                if pending:
                    decoder.admit([pending.pop(0)])
    return [results[i] for i in range(len(requests))], calls


def test_io_binding_gives_the_same_tokens_scores_and_attention(tiny_bundle: Path) -> None:
    bundle = load_bundle(tiny_bundle)
    beams, lengths = [8, 1, 1, 2, 1, 3, 1, 2], [16, 3, 4, 5, 2, 6, 3, 4]  # random weights rarely stop by themselves
    requests = requests_of(bundle, beams, lengths, attention=True)
    host, calls = staggered(open_runner(bundle, "cpu", io_binding=False), requests)
    device, device_calls = staggered(open_runner(bundle, "cpu", io_binding=True), requests)
    alone = [decode(open_runner(bundle, "cpu"), [r])[0] for r in requests]
    assert calls == device_calls
    assert all(calls[name] for name in ("fill", "split", "absorb")), f"not every path is covered: {calls}"
    assert [[h.tokens for h in r.hypotheses] for r in host] == [[h.tokens for h in r.hypotheses] for r in alone]
    # Padded alone and in a batch, the same row's sums may differ in the last bits: compare them more loosely.
    pairs = [(a, b, 1e-6) for a, b in zip(host, device, strict=True)]
    pairs += [(a, b, 1e-5) for a, b in zip(host, alone, strict=True)]
    for a, b, atol in pairs:
        np.testing.assert_allclose(a.encoder_attention, b.encoder_attention, rtol=1e-5, atol=atol)
        assert [h.tokens for h in a.hypotheses] == [h.tokens for h in b.hypotheses]
        for ha, hb in zip(a.hypotheses, b.hypotheses, strict=True):
            np.testing.assert_allclose(ha.token_scores, hb.token_scores, rtol=1e-5, atol=1e-5)
            rows_a, rows_b = ha.cross_attention + ha.self_attention, hb.cross_attention + hb.self_attention
            for x, y in zip(rows_a, rows_b, strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=atol)


def assert_exact_answers(bundle: Bundle, requests: list[DecodeRequest], results: list[DecodeResult]) -> None:
    """Each result has the tokens and scores of its request decoded alone on the exact graphs (decoder.onnx)."""
    exact = [decode(open_runner(bundle, "cpu"), [r])[0] for r in requests]
    for a, b in zip(results, exact, strict=True):
        assert [h.tokens for h in a.hypotheses] == [h.tokens for h in b.hypotheses]
        for ha, hb in zip(a.hypotheses, b.hypotheses, strict=True):
            np.testing.assert_allclose(ha.token_scores, hb.token_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("io_binding", [False, True])
def test_caches_written_in_place_give_the_exact_graphs_answers(tiny_bundle: Path, io_binding: bool) -> None:
    """float32's fast decoder (each row's tokens at the start of cache buffers that it writes in place) through
    joins, beams, holes, and buffers that grow (past 16 and 32 slots) and shrink again: the exact graphs' tokens
    and scores, with host caches and with device caches (IOBinding, the CUDA path)."""
    bundle = load_bundle(tiny_bundle)
    requests = requests_of(bundle, [1, 3, 1, 2, 1, 4, 1, 2], [40, 3, 4, 5, 2, 20, 3, 4])
    fast = open_runner(bundle, "cpu", io_binding=io_binding, role="fast_decoder")
    assert isinstance(fast, InPlaceRunner) and not fast.attention
    capacities: list[int] = []
    prepare = DeviceInPlaceCaches.prepare

    def recorded(caches: DeviceInPlaceCaches, rows: Any) -> int:
        capacities.append(prepare(caches, rows))
        return capacities[-1]

    with patch.object(DeviceInPlaceCaches, "prepare", recorded):
        in_place, _ = staggered(fast, requests)
    assert {16, 32, 64} <= set(capacities) and capacities[-1] < 64, f"the buffers did not grow and shrink: {capacities}"
    assert_exact_answers(bundle, requests, in_place)


@pytest.mark.parametrize("io_binding", [False, True])
def test_greedy_requests_without_scores_take_the_graphs_tokens(tiny_bundle: Path, io_binding: bool) -> None:
    """Greedy unscored rows take the fast decoder's own greedy tokens instead of logits (attnserve.GreedyTokens);
    a beam request or a scored one joining gets logits for its own rows, the others keep the graph's tokens: the
    exact graphs' tokens either way."""
    bundle = load_bundle(tiny_bundle)
    requests = requests_of(bundle, [1, 1, 1, 2, 1, 1, 1, 1], [9, 3, 4, 5, 2, 6, 3, 4], scores=False)
    requests[5] = replace(requests[5], scores=True)
    fast = open_runner(bundle, "cpu", io_binding=io_binding, role="fast_decoder")
    assert isinstance(fast, InPlaceRunner) and fast.greedy_tokens
    modes: list[str] = []
    bind = InPlaceRunner._bind_rows

    def recorded(runner: InPlaceRunner, binding: Any, bound: dict[str, Any], B: int, rows: np.ndarray | None) -> None:
        T = 0 if rows is None else len(rows)
        mode = "tokens" if T == B else "logits" if T == 0 else "both"
        if not modes or modes[-1] != mode:
            modes.append(mode)
        bind(runner, binding, bound, B, rows)

    with patch.object(InPlaceRunner, "_bind_rows", recorded):
        results, _ = staggered(fast, requests)
    assert modes[0] == "tokens" and "both" in modes, modes  # (logits for all: only beam or scored rows, a probe)
    assert_exact_answers(bundle, requests, results)


def test_greedy_steps_give_the_exact_tokens_in_either_mode(tiny_bundle: Path) -> None:
    """Greedy steps alternating between the graph's greedy tokens and every row's logits (GreedyChoice's two
    modes) give the exact graphs' tokens, and each mode's cost a row is measured."""
    bundle = load_bundle(tiny_bundle)
    requests = requests_of(bundle, [1] * 8, [9, 3, 4, 5, 2, 6, 3, 4], scores=False)
    asked: list[bool] = []

    def alternate(choice: GreedyChoice, rows: int) -> bool:
        choice.steps += 1
        asked.append(choice.steps % 2 == 0)
        return asked[-1]

    fast = open_runner(bundle, "cpu", role="fast_decoder")
    with patch.object(GreedyChoice, "tokens", alternate):
        results, _ = staggered(fast, requests)
    assert True in asked and False in asked
    assert_exact_answers(bundle, requests, results)


def test_compaction_moves_rows_into_holes_and_changes_no_answer(tiny_bundle: Path) -> None:
    """One batch of 24 requests (greedy and beams) where the first finish first: compacting moves rows from the
    end into their holes (host buffers written in place) and keeps the first rows, and every request still gets the
    exact graphs' answer."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokenizer
    texts = ["Open", "Delete the selected files?", "Save as", "Print the document in this window now"]
    requests = [
        DecodeRequest(src=tok.encode_source(texts[i % 4]), beam_size=[1, 2, 1, 3][i % 4], max_length=2 + i)
        for i in range(24)
    ]
    moved: list[int] = []
    compact = Batch._compact

    def recorded(batch: Batch) -> None:
        live = batch.rows.job >= 0
        moved.append(int(np.count_nonzero(live[np.count_nonzero(live) :])))  # live rows past the first n
        compact(batch)

    with patch.object(Batch, "_compact", recorded):
        results = decode(open_runner(bundle, "cpu", role="fast_decoder"), requests)
    assert sum(moved) > 0, f"no row moved into a hole: {moved}"
    assert_exact_answers(bundle, requests, results)


def test_an_empty_batch_keeps_the_encoders_caches(tiny_bundle: Path) -> None:
    """A request that starts an empty batch (host buffers) keeps the encoder's cross keys and values, without a
    copy; newcomers' are copied into the batch's rows, and every request gets the exact graphs' answer."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokenizer
    requests = [DecodeRequest(src=tok.encode_source(t), max_length=8) for t in ("Open file", "Save as", "Close")]
    runner = open_runner(bundle, "cpu", role="fast_decoder")
    encoded: list[Any] = []
    encode = runner.encode

    def recorded(*args: np.ndarray) -> Any:
        encoded.append(encode(*args))
        return encoded[-1]

    decoder = BatchDecoder(runner)
    with patch.object(runner, "encode", recorded):
        decoder.admit([(0, requests[0])])
        batch = decoder.young
        theirs = encoded[0].cross_keys + encoded[0].cross_values
        assert all(a is b for a, b in zip(batch.caches.cross_keys + batch.caches.cross_values, theirs, strict=True))
        results = dict(decoder.step()[0])
        decoder.admit([(1, requests[1]), (2, requests[2])])  # the batch grows: theirs are copied into new rows
        while decoder.num_rows:
            results.update(decoder.step()[0])
    assert_exact_answers(bundle, requests, [results[i] for i in range(3)])


def test_newcomers_take_the_rows_that_buffers_have_room_for(tiny_bundle: Path) -> None:
    """Host buffers written in place grow with room for twice the rows; newcomers then take the rows after the
    batch's without a copy (the same arrays), and every request gets the exact graphs' answer."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokenizer
    texts = ["Print the document", "Save as", "Open file", "Close", "Settings"]  # the longest source first
    requests = [DecodeRequest(src=tok.encode_source(t), max_length=12) for t in texts]
    decoder = BatchDecoder(open_runner(bundle, "cpu", role="fast_decoder"))
    batch = decoder.young
    results: dict[Any, DecodeResult] = {}
    decoder.admit([(0, requests[0]), (1, requests[1])])
    results.update(decoder.step()[0])
    decoder.admit([(2, requests[2])])  # 2 -> 3 rows: new arrays, room for 4
    results.update(decoder.step()[0])
    assert len(batch.rows) == 3, "nobody left yet"

    def buffers() -> list[np.ndarray]:
        return [
            *batch.caches.past_keys,
            *batch.caches.past_values,
            *batch.caches.cross_keys,
            *batch.caches.cross_values,
        ]

    arrays = [c.base for c in buffers()]
    assert all(a is not None and len(a) == 4 for a in arrays)
    decoder.admit([(3, requests[3])])  # 3 -> 4 rows: the room
    assert all(c.base is a for c, a in zip(buffers(), arrays, strict=True))
    decoder.admit([(4, requests[4])])  # 4 -> 5 rows: new arrays again
    assert not any(c.base is a for c, a in zip(buffers(), arrays, strict=True))
    while decoder.num_rows:
        results.update(decoder.step()[0])
    assert_exact_answers(bundle, requests, [results[i] for i in range(len(requests))])


def test_rows_of_one_beam_width_share_their_sources(tiny_bundle: Path) -> None:
    """Beam requests of one width only: the cross caches hold one source a request (k rows), through compaction
    (whole groups move into holes) and newcomers of that width; a greedy newcomer ungroups them. Every answer is
    the exact graphs'."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokenizer
    texts = ["Open", "Delete the selected files?", "Save as", "Print the document in this window now"]
    requests = [DecodeRequest(src=tok.encode_source(texts[i % 4]), beam_size=3, max_length=2 + i) for i in range(8)]
    requests += [DecodeRequest(src=tok.encode_source(t), beam_size=3, max_length=12) for t in texts[:2]]
    requests.append(DecodeRequest(src=tok.encode_source(texts[3]), max_length=6))  # greedy
    joins = {0: list(range(8)), 5: [8, 9], 9: [10]}  # step -> requests that join before it
    groups: list[int] = []
    moved: list[int] = []
    compact = Batch._compact

    def recorded(batch: Batch) -> None:
        live = batch.rows.job >= 0
        if batch.caches.group > 1:
            moved.append(int(np.count_nonzero(live[np.count_nonzero(live) :])))
        compact(batch)

    runner = open_runner(bundle, "cpu", role="fast_decoder")
    assert runner.form.grouped_cross
    decoder = BatchDecoder(runner)
    decoder.encode(list(enumerate(requests)))
    results: dict[int, DecodeResult] = {}
    with patch.object(Batch, "_compact", recorded):
        for step in itertools.count():
            if step in joins:
                decoder.join(joins[step])
            if not decoder.num_rows and step > max(joins):
                break
            groups.append(decoder.young.caches.group)
            done, _ = decoder.step()
            results.update((int(k), r) for k, r in done)  # type: ignore[call-overload]
    assert groups[0] == groups[8] == 3 and groups[9] == 1, groups
    assert sum(moved) > 0, f"no group moved into a hole: {moved}"
    assert_exact_answers(bundle, requests, [results[i] for i in range(len(requests))])


def joined_over_steps(runner: Runner, requests: list[DecodeRequest]) -> list[DecodeResult]:
    """One encoder call for every request; they join the batch a few at a time, steps apart (encoded ahead)."""
    decoder = BatchDecoder(runner)
    decoder.encode(list(enumerate(requests)))
    groups = [[3, 0], [4], [1, 2]]
    results: dict[int, DecodeResult] = {}
    while groups or decoder.num_rows:
        if groups:
            decoder.join(groups.pop(0))
        done, _ = decoder.step()
        results.update((int(k), r) for k, r in done)  # type: ignore[call-overload]
    assert not decoder.waiting
    return [results[i] for i in range(len(requests))]


@pytest.mark.parametrize("joined", ["at once", "over steps"])
def test_packed_sources_give_every_text_its_own_answer(tiny_bundle: Path, joined: str) -> None:
    """Texts of different lengths share encoder rows (one encoder call), and join the batch at once or a few at
    a time: tokens, scores and every attention row are those of each text decoded alone."""
    bundle = load_bundle(tiny_bundle)
    tok = bundle.tokenizer
    texts = ["Print the document in this window now", "Open", "Delete the selected files?", "Save as", "Close"]
    requests = [
        DecodeRequest(src=tok.encode_source(t), beam_size=b, max_length=6, n_best=b, attention=True)
        for t, b in zip(texts, [1, 2, 1, 3, 1], strict=True)
    ]
    row, _ = pack(np.array([len(r.src) for r in requests]))
    assert row.max() + 1 < len(requests), "the texts were not packed"
    runner = open_runner(bundle, "cpu")
    together = decode(runner, requests) if joined == "at once" else joined_over_steps(runner, requests)
    alone = [decode(runner, [r])[0] for r in requests]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a.encoder_attention, b.encoder_attention, atol=1e-6)
        assert [h.tokens for h in a.hypotheses] == [h.tokens for h in b.hypotheses]
        for ha, hb in zip(a.hypotheses, b.hypotheses, strict=True):
            np.testing.assert_allclose(ha.token_scores, hb.token_scores, rtol=1e-5, atol=1e-5)
            for x, y in zip(
                ha.cross_attention + ha.self_attention, hb.cross_attention + hb.self_attention, strict=True
            ):
                np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_memory_settings_apply() -> None:
    assert tune_memory()  # glibc accepted every setting (CI runs Debian: glibc), and numpy has its switch
    from numpy._core import multiarray

    assert multiarray._set_madvise_hugepage(False) is False  # (it returns the setting it replaces)


@pytest.mark.parametrize("io_binding", [False, True])
def test_the_forced_decoder_gives_the_step_graphs_cross_attention(tiny_bundle: Path, io_binding: bool) -> None:
    bundle = load_bundle(tiny_bundle)
    runner = AppendedRunner(bundle, "cpu", io_binding=io_binding)
    assert runner.has_forced
    fast = open_runner(bundle, "cpu", role="fast_decoder", encoder=runner.encoder)
    assert not isinstance(fast, AppendedRunner)  # the exact runner's only
    requests = requests_of(bundle, [1, 1, 2, 1, 1, 3, 1, 2], [9, 3, 6, 1, 5, 4, 7, 2], attention=True)
    results = decode(runner, requests)
    hyps = [(r.src, h) for r, result in zip(requests, results, strict=True) for h in result.hypotheses]
    assert len({len(h.tokens) for _, h in hyps}) > 1 and len({len(s) for s, _ in hyps}) > 1  # padding on both sides
    forced = runner.cross_attention([s for s, _ in hyps], [h.tokens for _, h in hyps])
    L, h = bundle.spec.n_decoder_layers, bundle.spec.h
    for (src, hyp), rows in zip(hyps, forced, strict=True):
        assert rows.shape == (len(hyp.tokens), L, h, len(src))
        np.testing.assert_allclose(rows, np.stack(hyp.cross_attention), atol=1e-5)
    # A row alone gives what it gives in the batch.
    (alone,) = runner.cross_attention([hyps[1][0]], [hyps[1][1].tokens])
    np.testing.assert_allclose(alone, forced[1], atol=1e-6)


def test_a_bundle_without_a_forced_decoder_has_none(tiny_bundle: Path, tmp_path: Path) -> None:
    import shutil

    from service.runtime.manifest import Manifest

    copy = Path(shutil.copytree(tiny_bundle, tmp_path / "bundle"))
    manifest = Manifest.read(copy)
    del manifest.graphs["forced_decoder"], manifest.graph_forms["decoder.forced.onnx"]
    (copy / "decoder.forced.onnx").unlink()
    manifest.write_with_checksums(copy)
    runner = AppendedRunner(load_bundle(copy), "cpu")
    assert not runner.has_forced and runner.forced is None


SHIPPED = Path(__file__).resolve().parents[3] / "model" / "bundles" / "en-ja"
UI_STRINGS = [
    "Open file",
    "Save the document before closing?",
    "The connection to the server was lost.",
    "Delete the selected items permanently",
    "Show hidden files",
    "Could not read the configuration file.",
    "Print the current page",
    "Check for updates automatically",
    "The password is too short.",
    "Add a new account",
    "Search in all folders",
    "Restart the application to apply the changes.",
    "No results were found for your search.",
    "Copy the link to the clipboard",
    "Export the image as PNG",
    "Remember my choice",
]


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="no CUDA execution provider (onnxruntime-gpu on an NVIDIA GPU): python -m pytest -k cuda there",
)
@pytest.mark.parametrize("beam", [1, 4])
def test_cuda_gives_the_cpu_tokens_and_attention(beam: int) -> None:
    bundle = load_bundle(SHIPPED)
    cpu, cuda = open_runner(bundle, "cpu", 1), open_runner(bundle, "cuda", 1)
    assert cuda.provider == "CUDAExecutionProvider" and cuda.io_binding
    requests = [
        DecodeRequest(src=bundle.tokenizer.encode_source(t), beam_size=beam, max_length=64, attention=True)
        for t in UI_STRINGS
    ]
    for text, on_cpu, on_cuda in zip(UI_STRINGS, decode(cpu, requests), decode(cuda, requests), strict=True):
        a, b = on_cpu.hypotheses[0], on_cuda.hypotheses[0]
        assert a.tokens == b.tokens, text
        assert np.abs(np.stack(a.cross_attention) - np.stack(b.cross_attention)).max() <= 1e-3, text
