"""Tests of model/export/selection.py: the device decoder's selection tail, on ONNX Runtime's CPU execution provider,
against the host's own arithmetic and ranking (service/runtime/_beam.c through service/decoding/search.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from model.export.names import SELECTION_OUTPUTS
from model.export.selection import append_selection
from service.decoding.search import CandidateScores, Scores
from service.runtime.runner import Candidates

PAD = 7


def tail(V: int, dtype: int = TensorProto.FLOAT, providers: tuple[str, ...] = ()) -> ort.InferenceSession:
    """The selection tail alone, on a graph whose ``logits`` output is its input (on ``providers``, then the
    CPU's)."""
    logits = helper.make_tensor_value_info("logits", dtype, ["batch", V])
    graph = helper.make_graph([], "tail", [logits], [logits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    append_selection(model, V, PAD)
    onnx.checker.check_model(model, full_check=True)
    assert [o.name for o in model.graph.output] == SELECTION_OUTPUTS
    return ort.InferenceSession(model.SerializeToString(), providers=[*providers, "CPUExecutionProvider"])


def tied_logits(V: int, seed: int) -> np.ndarray:
    """Logits of few distinct values (many equal ones in every row), a row of one value, and rows equal to others."""
    rng = np.random.default_rng(seed)
    logits = rng.integers(-3, 3, size=(6, V)).astype(np.float32) / 2
    logits[2] = 1.0  # every token tied
    logits[4] = logits[0]  # rows equal to others: ties across rows
    logits[5] = logits[1]
    return logits


@pytest.mark.parametrize("V", [10, 203, 8000])
@pytest.mark.parametrize("K", [1, 2, 8])
def test_candidates_are_the_best_logits_lower_tokens_first(V: int, K: int) -> None:
    logits = tied_logits(V, V + K)
    tokens, values, log_norm, greedy = tail(V).run(SELECTION_OUTPUTS, {"logits": logits, "candidates": np.array([K])})
    masked = logits.copy()
    masked[:, PAD] = -np.inf
    order = np.lexsort((np.broadcast_to(np.arange(V), masked.shape), -masked), axis=1)  # by logit, then token
    np.testing.assert_array_equal(tokens, order[:, :K])
    np.testing.assert_array_equal(values, np.take_along_axis(masked, order[:, :K], axis=1))
    np.testing.assert_array_equal(greedy, masked.argmax(axis=1))  # numpy's: the first of equal logits
    assert not (tokens == PAD).any()
    host = Scores(masked.copy(), np.ones(len(masked), bool))  # _beam.c's log-normalizer
    np.testing.assert_allclose(log_norm, host.log_norm, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_2k_candidates_rank_as_every_logit_does(k: int) -> None:
    """Beam search of width k on each row's 2k candidates ranks the continuations that it ranks on every logit, ties
    across rows (equal rows) and within rows (equal logits) included: same rows, tokens and values."""
    V = 203
    logits = tied_logits(V, 11 * k)
    tokens, values, _, greedy = tail(V).run(SELECTION_OUTPUTS, {"logits": logits, "candidates": np.array([2 * k])})
    masked = logits.copy()
    masked[:, PAD] = -np.inf
    every = Scores(masked, np.ones(len(masked), bool))
    few = CandidateScores(Candidates(tokens, values, every.log_norm), greedy)  # one normalizer: ranks compare exactly
    rows = np.array([[0, 4, 1][:k] + [2] * max(0, k - 3), [5, 1, 3][:k] + [2] * max(0, k - 3)])
    hyp = np.zeros(rows.shape)
    hyp[1, -1] = -np.inf  # a row without a hypothesis yet
    want, got = every.top(rows, hyp, 2 * k), few.top(rows, hyp, 2 * k)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(few.logp(want[1], want[2]), every.logp(want[1], want[2]))
    np.testing.assert_array_equal(few.logp(np.arange(6), greedy), every.logp(np.arange(6), greedy))


def test_float16_logits_are_read_in_float32() -> None:
    logits = tied_logits(50, 3)
    session = tail(50, TensorProto.FLOAT16)
    assert {i.name: i.type for i in session.get_inputs()}["logits"] == "tensor(float16)"
    types = [o.type for o in session.get_outputs()]
    assert types == ["tensor(int64)", "tensor(float)", "tensor(float)", "tensor(int64)"]
    single = tail(50).run(SELECTION_OUTPUTS, {"logits": logits, "candidates": np.array([4])})
    got = session.run(SELECTION_OUTPUTS, {"logits": logits.astype(np.float16), "candidates": np.array([4])})
    for a, b in zip(single, got, strict=True):
        np.testing.assert_array_equal(a, b)  # halves of small integers are exact in float16


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="no CUDA execution provider (onnxruntime-gpu on an NVIDIA GPU): python -m pytest -k cuda there",
)
@pytest.mark.parametrize("K", [1, 8])
def test_cuda_selects_as_the_cpu_ties_included(K: int) -> None:
    """CUDA's TopK and ArgMax order equal logits as the CPU's do (the lower token first): the same candidates."""
    V = 8000
    logits = tied_logits(V, K)
    feed = {"logits": logits, "candidates": np.array([K])}
    cpu = tail(V).run(SELECTION_OUTPUTS, feed)
    cuda = tail(V, providers=("CUDAExecutionProvider",)).run(SELECTION_OUTPUTS, feed)
    for name, a, b in zip(SELECTION_OUTPUTS, cpu, cuda, strict=True):
        if name == "log_norm":
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)
