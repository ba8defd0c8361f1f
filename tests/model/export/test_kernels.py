"""attnserve's kernels (service/runtime/_attention.c, as the builder's nodes call them) against PyTorch and ONNX
Runtime's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model.config import TransformerConfig
from model.export.build import export_fast_decoder
from model.export.builder.graphs import greedy_tokens, projection
from model.export.builder.ops import FLOAT, INT32, INT64, Graph
from model.export.examples import fast_example
from model.transformer import attention, segment_mask
from service.runtime.kernels import attention_kernels, kernel_session
from tests.bundles import tiny_model


def kernel_graph(path: Path, h: int, d_k: int, inputs: dict[str, tuple[int, int]], axes: dict[str, dict[int, str]],
                 weights: dict[str, np.ndarray] | None = None, **config: object) -> Graph:  # fmt: skip
    """A graph of a model of h heads of d_k features, its inputs (name -> element type, rank) declared, all axes
    named by ``axes``; the caller adds the nodes and outputs and saves it at ``path``."""
    c = TransformerConfig(**{"vocab_size": 2, "pad_id": 1, "decoder_start_id": 1, "d_model": h * d_k, "h": h,
                             **config})  # type: ignore[arg-type]  # fmt: skip
    g = Graph(c, weights or {}, axes)
    for name, (elem, rank) in inputs.items():
        g.input(name, elem, [None] * rank)
    return g


def heads(x: np.ndarray, h: int) -> torch.Tensor:
    """(B, T, h d_k) -> (B, h, T, d_k)."""
    B, T, d = x.shape
    return torch.from_numpy(x).view(B, T, h, d // h).transpose(1, 2)


def test_segment_attention_is_pytorchs_under_any_segments(tmp_path: Path) -> None:
    """attnserve.SegmentAttention against PyTorch's attention under model.transformer.segment_mask: texts that
    interleave (a query's keys need not be side by side), padding between and after them (a padding query attends
    to every real key), one text a row; a row of padding only gets zeros (PyTorch's: the mean of its values, never
    read)."""
    h, d_k = 4, 8
    segments = np.array([[1, 2, 1, 0, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1], [3, 3, 0, 0, 5, 0, 0], [0] * 7], np.int32)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 7, h * d_k)).astype(np.float32) * 2 for _ in range(3))
    path = tmp_path / "attend.onnx"
    axes = {name: {0: "batch", 1: "length", 2: "features"} for name in ("q", "k", "v", "segments", "out")}
    g = kernel_graph(path, h, d_k, {"q": (FLOAT, 3), "k": (FLOAT, 3), "v": (FLOAT, 3), "segments": (INT32, 2)}, axes)
    g.output(g.custom("SegmentAttention", "q", "k", "v", "segments", g.const(h)), "out", FLOAT, [None] * 3)
    onnx.save(g.model("attend"), str(path))
    got = kernel_session(path).run(["out"], {"q": q, "k": k, "v": v, "segments": segments})[0]
    out, _ = attention(heads(q, h), heads(k, h), heads(v, h), segment_mask(torch.from_numpy(segments)))
    want = out.transpose(1, 2).reshape(q.shape).numpy()
    np.testing.assert_allclose(got[:3], want[:3], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[3], 0)
    assert not np.allclose(got[0, 0], got[0, 2]) and not np.allclose(got[0, 0], got[0, 1])  # not one average


def test_attnserve_kernels_equal_onnxruntimes(tmp_path: Path) -> None:
    """service/runtime/_attention.c against ONNX Runtime's MultiHeadAttention and GroupQueryAttention on one graph's
    step, caches bound in place as the runner binds them: rows of several lengths and sources of several lengths
    (masked), rows grouped by source; logits and every row's written slots agree, and the kernels refuse a row
    whose cache has no slot left."""
    import onnxruntime as ort

    model = tiny_model(365)
    ours, theirs = tmp_path / "ours.onnx", tmp_path / "theirs.onnx"
    export_fast_decoder(model, ours)
    theirs.write_bytes(ours.read_bytes())
    attention_kernels(theirs, model.config.h, "onnxruntime")  # GreedyTokens stays attnserve's
    feed, _ = fast_example(model, greedy=True)
    lengths = feed["position_ids"][:, 0]
    assert len(set(lengths.tolist())) > 1 and len(set(feed["encoder_attention_mask"].sum(1).tolist())) > 1
    steps = []
    for path in (ours, theirs):
        session, buffers = kernel_session(path), {k: v.copy() for k, v in feed.items()}
        binding = session.io_binding()
        for name, value in buffers.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
            if name.startswith("past_"):
                binding.bind_ortvalue_output(name.replace("past_", "present_"), ort.OrtValue.ortvalue_from_numpy(value))
        binding.bind_output("logits", "cpu")
        session.run_with_iobinding(binding)
        steps.append((binding.get_outputs()[0].numpy(), buffers))
    (logits, mine), (want, reference) = steps
    np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-5)
    for name in (k for k in feed if k.startswith("past_")):
        for b, n in enumerate(lengths):
            np.testing.assert_allclose(mine[name][b, :, : n + 1], reference[name][b, :, : n + 1], rtol=1e-5, atol=1e-5)
    full = {**feed, "position_ids": np.full_like(feed["position_ids"], feed["past_keys.0"].shape[2])}
    with pytest.raises(Exception, match="no slot for its new key"):
        kernel_session(ours).run(["logits"], full)


def test_cross_attention_reads_no_key_past_the_last_unmasked_one(tmp_path: Path) -> None:
    """attnserve.Attention over sources padded at the end (a continuous batch is as wide as its longest source): the
    keys and values past a source's last unmasked key, from the next whole vector of 8 on, are never read (NaN there
    changes nothing), and the answer equals that of the source without its padding, bit for bit."""
    h, d_k, G = 4, 8, 2
    lengths = [3, 16, 11, 40]  # 40: the widest, no padding
    S = max(lengths)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((len(lengths), G, h * d_k)).astype(np.float32)
    K, V = (rng.standard_normal((len(lengths), h, S, d_k)).astype(np.float32) for _ in range(2))
    mask = (np.arange(S)[None] < np.array(lengths)[:, None]).astype(np.int32)
    for j, n in enumerate(lengths):
        K[j, :, -(-n // 8) * 8 :] = V[j, :, -(-n // 8) * 8 :] = np.nan  # past the vector that holds the last key
    path = tmp_path / "cross.onnx"
    axes = {"q": {0: "J", 1: "G", 2: "d"}, "K": {0: "J", 1: "h", 2: "S", 3: "d_k"}, "mask": {0: "J", 1: "S"},
            "out": {0: "J", 1: "G", 2: "d"}}  # fmt: skip
    axes["V"] = axes["K"]
    g = kernel_graph(path, h, d_k, {"q": (FLOAT, 3), "K": (FLOAT, 4), "V": (FLOAT, 4), "mask": (INT32, 2)}, axes)
    g.output(g.custom("Attention", "q", "K", "V", "mask"), "out", FLOAT, [None] * 3)
    onnx.save(g.model("cross"), str(path))
    session = kernel_session(path)
    padded = session.run(["out"], {"q": q, "K": K, "V": V, "mask": mask})[0]
    assert np.isfinite(padded).all()
    for j, n in enumerate(lengths):
        width = min(-(-n // 8) * 8, S)  # the same vectors of keys as the padded source's
        alone = {
            "q": q[j : j + 1],
            "K": K[j : j + 1, :, :width],
            "V": V[j : j + 1, :, :width],
            "mask": mask[j : j + 1, :width],
        }
        np.testing.assert_array_equal(padded[j], session.run(["out"], alone)[0][0])


def greedy_graph(path: Path, W: np.ndarray, bias: np.ndarray, pad: int) -> Path:
    """A graph of ``greedy_tokens`` on rows h (rows, d) for the projection W (V, d) and ``bias`` (V,) or none (0,),
    saved at ``path``."""
    V, d = W.shape
    weights = {"src_embed.lut.weight": W, "generator.final_logits_bias": bias}
    g = kernel_graph(path, 1, d, {"h": (FLOAT, 2)}, {"h": {0: "rows", 1: "d"}, "tokens": {0: "rows"}}, weights,
                     vocab_size=V, pad_id=pad, decoder_start_id=pad, final_logits_bias=len(bias) > 0)  # fmt: skip
    g.output(greedy_tokens(g, "h"), "tokens", INT64, [None])
    onnx.save(g.model("greedy"), str(path))
    return path


@pytest.mark.parametrize("biased", [False, True])
def test_greedy_tokens_are_the_float32_argmax(tmp_path: Path, biased: bool) -> None:
    """attnserve.GreedyTokens (the projection in 7-bit integers, the float32 logits of the tokens its error bound
    cannot rule out) gives the argmax of the logits, padding left out: rows of very different scales (a large one
    rules out few tokens), an exact tie (the first token wins, as numpy's argmax), padding as the largest logit,
    a row of zeros (every token ties), a token that a -inf bias rules out, and no rows at all."""
    rng = np.random.default_rng(0)
    V, d, pad = 300, 48, 7
    W = rng.standard_normal((V, d)).astype(np.float32) * 0.3
    W[11], W[20] = W[5], 0  # a twin of token 5, a row of zeros
    bias = np.zeros(0, np.float32)
    if biased:
        bias = rng.standard_normal(V).astype(np.float32)
        bias[3], bias[4], bias[11] = -np.inf, 4.0, bias[5]
    h = np.concatenate([rng.standard_normal((40, d)) * scale for scale in (0.01, 1.0, 30.0)])
    h = np.concatenate([h, 5 * W[[5, pad]], 8 * W[[3]], np.zeros((1, d))]).astype(np.float32)
    path = greedy_graph(tmp_path / "greedy.onnx", W, bias, pad)
    assert [n.op_type for n in onnx.load(str(path)).graph.node][-1] == "GreedyTokens"
    session = kernel_session(path)
    got = session.run(["tokens"], {"h": h})[0]
    logits = h.astype(np.float64) @ W.T.astype(np.float64) + (bias if biased else 0)
    logits[:, pad] = -np.inf
    np.testing.assert_array_equal(got, logits.argmax(axis=1))
    assert got[-4] == 5 and got[-3] != pad and got[-1] == (0 if not biased else logits[-1].argmax())
    if biased:
        assert 3 not in got
    assert session.run(["tokens"], {"h": h[:0]})[0].shape == (0,)


@pytest.mark.parametrize("d", [48, 13])
def test_greedy_tokens_where_the_screen_gives_up_are_the_float32_argmax(tmp_path: Path, d: int) -> None:
    """A projection whose rows are one shared direction plus a small spread (a model unsure of the next token): the
    screen's error bound admits most of the vocabulary, so the rows get every token's float32 logit, tiles of rows
    and tokens at a time. Rows and tokens not multiples of a tile, a vocabulary across several chunks, d not a
    multiple of a vector; padding, the first of equal logits and a -inf bias as in the screen's path."""
    rng = np.random.default_rng(1)
    V, pad = 2_051, 2_050
    W = (rng.standard_normal(d) + 0.05 * rng.standard_normal((V, d))).astype(np.float32)
    bias = (0.01 * rng.standard_normal(V)).astype(np.float32)
    bias[pad], bias[4] = 5.0, -np.inf
    h = rng.standard_normal((7, d)).astype(np.float32)
    twin = int((h[3] @ W[:-2].T + bias[:-2]).argmax())  # row 3's token, given a twin last but one: the first wins
    W[-2], bias[-2] = W[twin], bias[twin]
    # The premise: the screen's bound (service/runtime/_attention.c) admits more than half the tokens of each row.
    w_scale, h_scale = np.abs(W).max() / 63, np.abs(h).max(axis=1, keepdims=True) / 127
    h_int = np.rint(h / h_scale)
    approx = h_int @ np.rint(W / w_scale).T * h_scale * w_scale
    e = h_scale * np.abs(W).sum(axis=1).max() + w_scale / 2 * np.abs(h_int * h_scale).sum(axis=1, keepdims=True)
    spread = np.ptp(bias[np.isfinite(bias)])
    assert (approx >= approx.max(axis=1, keepdims=True) - 2 * e - spread).mean(axis=1).min() > 0.5
    got = kernel_session(greedy_graph(tmp_path / "greedy.onnx", W, bias, pad)).run(["tokens"], {"h": h})[0]
    logits = (h[:, None, :] * W[None]).sum(axis=2, dtype=np.float64) + bias
    logits[:, pad] = -np.inf
    np.testing.assert_array_equal(got, logits.argmax(axis=1))
    assert got[3] == twin and 4 not in got and pad not in got


@pytest.mark.parametrize("d", [48, 13])
def test_logits_from_the_projections_panels_are_its_float32_product(tmp_path: Path, d: int) -> None:
    """attnserve.Logits (rows of h times the projection, read from its panels of 16 tokens) plus the bias, against
    float64: any number of rows (groups of rows and what is left of them), a vocabulary that fills neither a panel nor
    a group of panels nor a task's chunk, d not a multiple of a vector, a -inf bias, and no rows at all."""
    rng = np.random.default_rng(2)
    V = 2_051
    W = rng.standard_normal((V, d)).astype(np.float32)
    bias = rng.standard_normal(V).astype(np.float32)
    bias[9] = -np.inf
    weights = {"src_embed.lut.weight": W, "generator.final_logits_bias": bias}
    path = tmp_path / "logits.onnx"
    g = kernel_graph(path, 1, d, {"h": (FLOAT, 2)}, {"h": {0: "rows", 1: "d"}, "logits": {0: "rows", 1: "V"}},
                     weights, vocab_size=V, final_logits_bias=True)  # fmt: skip
    g.output(g.custom("Logits", "h", *projection(g)), "logits", FLOAT, [None, V])
    onnx.save(g.model("logits"), str(path))
    session = kernel_session(path)
    for rows in (1, 2, 3, 4, 5, 7, 17, 30):
        h = rng.standard_normal((rows, d)).astype(np.float32)
        got = session.run(["logits"], {"h": h})[0]
        want = h.astype(np.float64) @ W.T.astype(np.float64) + bias
        assert got.shape == (rows, V) and np.isneginf(got[:, 9]).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want[np.isfinite(want)]).max())
    assert session.run(["logits"], {"h": np.zeros((0, d), np.float32)})[0].shape == (0, V)
