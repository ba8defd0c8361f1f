"""The device decoder (decoder.device.onnx, CUDA's /translate graph) on ONNX Runtime's CPU execution provider, run
as on CUDA (device values, one binding a thread): every request gets the exact graphs' tokens and scores, greedy and
beam search, batched or alone, through joins, holes, compaction, splits and ties."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, decode
from service.decoding.gathered import GatheredCaches
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.manifest import Manifest
from service.runtime.runner import Runner, open_runner
from service.runtime.tensors import DeviceTensors
from tests.service.runtime.test_runner import SHIPPED, UI_STRINGS, assert_exact_answers, requests_of, staggered


def device_runner(bundle: Bundle) -> Runner:
    runner = open_runner(bundle, "cpu", role="device_decoder")
    assert runner.form.candidates and not runner.attention and isinstance(runner.tensors, DeviceTensors)
    return runner


def test_the_device_decoder_gives_the_exact_graphs_answers(tiny_bundle: Path) -> None:
    """Greedy rows and beams of several widths join as others finish (into holes or at the end), reorder, leave, get
    trimmed, and move from the young batch to the old one: the exact graphs' tokens and scores for every request,
    with no cache row copied for a beam step."""
    bundle = load_bundle(tiny_bundle)
    requests = requests_of(bundle, [8, 1, 1, 2, 1, 3, 1, 4], [16, 3, 4, 5, 2, 6, 3, 4])
    fills: Counter[int] = Counter()
    fill = GatheredCaches.fill

    def counted(caches: GatheredCaches, ix: np.ndarray, *args: Any) -> None:
        fills[len(ix)] += 1
        fill(caches, ix, *args)

    with patch.object(GatheredCaches, "fill", counted), patch.object(DeviceTensors, "put") as put:
        results, calls = staggered(device_runner(bundle), requests)
    assert calls["split"] and calls["absorb"], f"not every path is covered: {calls}"
    assert sum(fills.values()) >= len(requests) - 1 and not put.called  # reordered inside the step
    assert_exact_answers(bundle, requests, results)


def test_sources_are_shared_by_their_beams_and_dropped_when_unread(tiny_bundle: Path) -> None:
    """One cross row a request, however many beams; rows of finished requests' sources go once they are as many as
    the rest, and compaction keeps only the sources its rows read."""
    bundle = load_bundle(tiny_bundle)
    requests = requests_of(bundle, [4, 3, 1, 2, 1, 4, 1, 2], [9, 3, 4, 5, 2, 6, 3, 4])
    decoder = BatchDecoder(device_runner(bundle))
    decoder.admit(list(enumerate(requests)))
    caches = decoder.young.caches
    assert isinstance(caches, GatheredCaches)
    seen: list[tuple[int, int]] = []  # (sources held, sources read)
    results: dict[Any, DecodeResult] = {}
    while decoder.num_rows:
        live = decoder.young.rows.job >= 0
        caches = decoder.young.caches
        assert isinstance(caches, GatheredCaches)
        seen.append((len(caches.encoder_mask), len(set(caches.source[live].tolist()))))
        done, _ = decoder.step()
        results.update(done)
    assert seen[0] == (len(requests), len(requests))  # 18 rows, 8 sources
    assert all(held <= 2 * read or read == 0 for held, read in seen) and any(held > read for held, read in seen)
    assert_exact_answers(bundle, requests, [results[i] for i in range(len(requests))])


def tied(bundle: Path, tmp_path: Path, low: int, high: int, eos_bias: float) -> Path:
    """A copy of ``bundle`` in which token ``low`` has token ``high``'s embedding (the output projection's row too:
    they are tied) and logits bias, so that their logits are equal at every step, and whose </s> bias is
    ``eos_bias`` higher (more hypotheses end by themselves). The weights are edited in the weights file that every
    graph reads."""
    copy = Path(shutil.copytree(bundle, tmp_path / "tied"))
    graph = onnx.load(str(copy / "decoder.device.onnx"), load_external_data=False).graph
    where = {t.name: {e.key: int(e.value) for e in t.external_data if e.key != "location"} for t in graph.initializer}
    weights = np.memmap(copy / "weights.bin", np.uint8, "r+")

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
        at = where[name]
        return weights[at["offset"] : at["offset"] + at["length"]].view(np.float32).reshape(shape)

    manifest = Manifest.read(copy)
    V = manifest.model["vocab_size"]
    embedding, bias = tensor("model.src_embed.lut.weight", (V, -1)), tensor("model.generator.final_logits_bias", (V,))
    embedding[low], bias[low] = embedding[high], bias[high]
    bias[manifest.model["eos_id"]] += eos_bias
    weights.flush()
    manifest.write_with_checksums(copy)
    return copy


def test_ties_go_to_the_lower_token_as_on_the_host(tiny_bundle: Path, tmp_path: Path) -> None:
    """Two tokens whose logits are equal at every step: the exact graphs (numpy's argmax, _beam.c's ranking) and the
    device decoder (ONNX's ArgMax and TopK) both take the lower one, greedy and in beams; with </s> likelier, rows
    finish by themselves as well as at max_length."""
    bundle = load_bundle(tiny_bundle)
    lengths = [16, 12, 14, 10, 12, 16, 12, 14]
    plain = [h.tokens for r in decode(open_runner(bundle, "cpu"), requests_of(bundle, [1] * 8, lengths))
             for h in r.hypotheses]  # fmt: skip
    emitted = Counter(t for tokens in plain for t in tokens)
    high = max((t for t in emitted if t > 2), key=emitted.__getitem__)  # a token the model emits often
    low = min(t for t in range(2, high) if t not in emitted)
    tied_bundle = load_bundle(tied(tiny_bundle, tmp_path, low, high, eos_bias=8.0))
    for beams in ([1] * 8, [4, 1, 2, 4, 1, 3, 4, 2]):
        requests = requests_of(tied_bundle, beams, lengths)
        batched, _ = staggered(device_runner(tied_bundle), requests)
        alone = [decode(device_runner(tied_bundle), [r])[0] for r in requests]
        assert_exact_answers(tied_bundle, requests, batched)
        assert_exact_answers(tied_bundle, requests, alone)
        hypotheses = [h.tokens for r in batched for h in r.hypotheses]
        assert any(low in tokens for tokens in hypotheses)
        if max(beams) == 1:  # (a beam may hold both: a child of each)
            assert not any(high in tokens for tokens in hypotheses)
        ended = [tokens[-1] == tied_bundle.spec.eos_id for tokens in hypotheses]
        assert any(ended) and not all(ended), "rows should finish both by </s> and at max_length"


TEXTS = [*UI_STRINGS, "Cancel", "Apply the settings to every window", "The file could not be saved.",
         "Rename the selected folder", "Your changes will be lost.", "Open recent documents", "Sign in to continue",
         "Download the latest version", "Close all tabs?", "Show line numbers", "Undo the last action",
         "A new version is available.", "Select a language", "Move to trash", "Paste as plain text",
         "Check your internet connection."]  # fmt: skip


@pytest.mark.parametrize("beam", [1, 4])
def test_the_shipped_bundle_decodes_as_its_exact_graphs(beam: int) -> None:
    """model/bundles/en-ja on 32 interface strings, batched and one at a time: the exact graphs' tokens."""
    bundle = load_bundle(SHIPPED)
    requests = [DecodeRequest(src=bundle.tokenizer.encode_source(t), beam_size=beam, max_length=64) for t in TEXTS]
    assert len(requests) == 32
    runner = device_runner(bundle)
    batched, alone = decode(runner, requests), [decode(runner, [r])[0] for r in requests]
    exact = decode(open_runner(bundle, "cpu"), requests)
    for text, a, b, want in zip(TEXTS, batched, alone, exact, strict=True):
        assert a.hypotheses[0].tokens == b.hypotheses[0].tokens == want.hypotheses[0].tokens, text


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="no CUDA execution provider (onnxruntime-gpu on an NVIDIA GPU): python -m pytest -k cuda there",
)
@pytest.mark.parametrize("beam", [1, 4])
def test_cuda_device_decoder_gives_the_cpu_tokens(beam: int) -> None:
    """The device decoder on CUDA (what /translate runs there) against the exact graphs on the CPU."""
    bundle = load_bundle(SHIPPED)
    cuda = open_runner(bundle, "cuda", role="device_decoder")
    assert cuda.provider == "CUDAExecutionProvider"
    requests = [DecodeRequest(src=bundle.tokenizer.encode_source(t), beam_size=beam, max_length=64) for t in TEXTS]
    for text, a, b in zip(TEXTS, decode(open_runner(bundle, "cpu"), requests), decode(cuda, requests), strict=True):
        assert a.hypotheses[0].tokens == b.hypotheses[0].tokens, text
