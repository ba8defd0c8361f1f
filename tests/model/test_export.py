"""ONNX Runtime against PyTorch on random models of several shapes, through the bundle and the service's decoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model.export import (
    KERNELS,
    GreedyTokens,
    Kernels,
    SegmentAttention,
    _export,
    add_float16,
    add_int8,
    attention_kernels,
    check_graphs,
    export_bundle,
    export_fast_decoder,
    export_fast_encoder,
    fast_example,
    kernel_session,
    load_state_dict,
    screen_weights,
)
from model.transformer import Transformer, greedy_decode
from service.bundle import load_bundle
from service.decoding import DecodeRequest, decode
from service.runner import Runner
from tests.bundles import tiny_model, tiny_spm

CONFIGS = {
    "h8-post-ln-relu": dict(d_model=64, h=8, n_encoder_layers=2, n_decoder_layers=2),
    "h1-unequal-depth": dict(d_model=16, h=1, n_encoder_layers=3, n_decoder_layers=1),
    "pre-ln-swish": dict(d_model=32, h=4, normalize_before=True, activation="swish"),
    "untied-gelu": dict(d_model=32, h=2, tie_embeddings=False, activation="gelu", scale_embedding=False),
}


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_spm(tmp_path_factory.mktemp("spm"))


def sources(model: Transformer) -> list[list[int]]:
    """A padded batch's worth of different lengths, each ending with </s>."""
    rng = np.random.default_rng(7)
    c = model.config
    return [[*rng.integers(2, c.vocab_size - 1, size=n).tolist(), c.eos_id] for n in (9, 5, 2, 7)]


@pytest.mark.parametrize("name", CONFIGS)
def test_onnx_matches_pytorch(name: str, spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365, seed=1, **CONFIGS[name])
    bundle_dir = export_bundle(
        model, tmp_path / name, name=name, source_lang="en", target_lang="ja", tokenizer={"source": spm, "target": spm}
    )
    # Logits, present keys/values and all three attention kinds, over a padded batch with a partly masked cache.
    assert check_graphs(model, bundle_dir, tolerance=1e-4) <= 1e-4

    # Greedy decoding through the step graph (the service's decoder) gives PyTorch's tokens, and the attention
    # rows it collected step by step equal a teacher-forced pass.
    runner = Runner(load_bundle(bundle_dir), "cpu")
    srcs = sources(model)
    results = decode(runner, [DecodeRequest(src=s, max_length=12, attention=True) for s in srcs])
    S = max(map(len, srcs))
    src = torch.tensor([s + [model.config.pad_id] * (S - len(s)) for s in srcs])
    expected = greedy_decode(model, src, (src != model.config.pad_id).long(), max_length=12).tolist()
    for s, result, want in zip(srcs, results, expected, strict=True):
        hyp = result.hypotheses[0]
        n = len(hyp.tokens)
        assert hyp.tokens == want[:n]
        assert all(t == model.config.pad_id for t in want[n:])
        x = torch.tensor([s])
        tgt = torch.tensor([[model.config.decoder_start_id, *hyp.tokens[:-1]]])
        with torch.no_grad():
            memory, enc_w = model.encode(x, torch.ones_like(x)[:, None, None].bool())
            mask = torch.ones_like(x)[:, None, None].bool()
            causal = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
            _, _, self_w, cross_w = model.decode(tgt, torch.arange(n)[None], model.memory_kv(memory), mask, causal)
        np.testing.assert_allclose(result.encoder_attention, torch.stack(enc_w)[:, 0].numpy(), atol=1e-4)
        for t in range(n):
            np.testing.assert_allclose(hyp.cross_attention[t], torch.stack(cross_w)[:, 0, :, t].numpy(), atol=1e-4)
            np.testing.assert_allclose(
                hyp.self_attention[t], torch.stack(self_w)[:, 0, :, t, : t + 1].numpy(), atol=1e-4
            )

    # The weights read back exactly.
    config, state = load_state_dict(bundle_dir)
    assert config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key


def test_export_refuses_to_overwrite(spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365)
    kwargs = dict(name="x", source_lang="en", target_lang="ja", tokenizer={"source": spm, "target": spm})
    export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(FileExistsError):
        export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    export_bundle(model, tmp_path / "b", force=True, **kwargs)  # type: ignore[arg-type]
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert set(manifest["sha256"]) == {"encoder.onnx", "decoder.onnx", "decoder.fast.onnx", "spm.model"}
    assert manifest["format"] == "attnserve-bundle/4"


def test_int8_variant(spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365)
    kwargs = dict(name="x", source_lang="en", target_lang="ja", tokenizer={"source": spm, "target": spm})
    bundle_dir = export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    add_int8(bundle_dir)
    bundle = load_bundle(bundle_dir)  # checks every file's sha256, the int8 graphs' included
    assert bundle.variants == ["float32", "int8"]
    src = bundle.tokenizer.encode_source("Open file")
    exact = decode(Runner(bundle, "cpu"), [DecodeRequest(src=src, max_length=6)])[0]
    int8 = Runner(bundle, "cpu", variant="int8")
    assert not int8.attention  # the fused encoder and decoder have no attention outputs
    assert int8.encode(*(np.array([x]) for x in (src, [1] * len(src), range(len(src))))).attentions is None
    approx = decode(int8, [DecodeRequest(src=src, max_length=6)])[0]
    assert len(approx.hypotheses[0].tokens) == len(exact.hypotheses[0].tokens)
    assert abs(approx.hypotheses[0].score - exact.hypotheses[0].score) < 0.5 * abs(exact.hypotheses[0].score)


@pytest.mark.parametrize("name", CONFIGS)
def test_fast_encoder_fuses_attention_and_matches_pytorch(name: str, tmp_path: Path) -> None:
    """encoder.fast.onnx (what the int8 variant quantizes): the exact encoder's cross keys and values, on a batch with
    padding and two texts packed in a row, from one attnserve.SegmentAttention a layer and no attention output."""
    model = tiny_model(365, seed=1, **CONFIGS[name])
    path = tmp_path / "encoder.fast.onnx"
    assert export_fast_encoder(model, path) <= 1e-4
    graph = onnx.load(str(path)).graph
    ops = [(n.domain, n.op_type) for n in graph.node]
    assert ops.count(("attnserve", "SegmentAttention")) == model.config.n_encoder_layers
    assert "Softmax" not in [op for _, op in ops]
    assert [o.name for o in graph.output] == [
        f"{kind}.{l}" for kind in ("cross_keys", "cross_values") for l in range(model.config.n_decoder_layers)
    ]


class Attend(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.h = h

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        return SegmentAttention.apply(q, k, v, segments, self.h)


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
    axes = {name: {0: "batch", 1: "length"} for name in ("q", "k", "v", "segments", "out")}
    args = tuple(torch.from_numpy(x) for x in (q, k, v, segments))
    _export(Attend(h), args, path, (["q", "k", "v", "segments"], ["out"]), axes, custom_opsets={KERNELS: 1})
    got = kernel_session(path).run(["out"], {"q": q, "k": k, "v": v, "segments": segments})[0]
    with torch.no_grad():
        want = Attend(h)(*args).numpy()
    np.testing.assert_allclose(got[:3], want[:3], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[3], 0)
    assert not np.allclose(got[0, 0], got[0, 2]) and not np.allclose(got[0, 0], got[0, 1])  # not one average


KERNEL_OPS = {
    "attnserve": (("attnserve", "CachedAttention"), ("attnserve", "Attention")),
    "onnxruntime": (("com.microsoft", "GroupQueryAttention"), ("com.microsoft", "MultiHeadAttention")),
}


@pytest.mark.parametrize("kernels", ["attnserve", "onnxruntime"])
def test_fast_decoder_fuses_attention_and_matches_pytorch(tmp_path: Path, kernels: Kernels) -> None:
    path = tmp_path / "decoder.fast.onnx"
    assert export_fast_decoder(tiny_model(365), path, kernels=kernels) <= 1e-4  # logits, each row's cache slots
    graph = onnx.load(str(path)).graph
    ops = [(n.domain, n.op_type) for n in graph.node]
    self_attention, cross_attention = KERNEL_OPS[kernels]
    assert ops.count(self_attention) == 2  # 2 decoder layers
    assert ops.count(cross_attention) == 2
    assert len({d for d, _ in ops if d}) == 1  # one domain of attention kernels
    assert "self_attention_mask" not in [i.name for i in graph.input]
    # attnserve's form computes logits or greedy tokens (screened in int8, checked in float32) by row.
    greedy = kernels == "attnserve"
    assert ("logit_rows" in [i.name for i in graph.input]) == greedy
    assert [o.name for o in graph.output] == [
        "logits",
        *(["tokens"] if greedy else []),
        *(f"present_{k}.{l}" for k in ("keys", "values") for l in (0, 1)),
    ]
    assert (("attnserve", "GreedyTokens") in ops) == greedy


@pytest.fixture(scope="module", params=["attnserve", "onnxruntime"])
def fast_decoder(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> tuple[Transformer, Path, dict[str, np.ndarray]]:
    """A tiny model, its exported fast decoder, with attnserve's attention kernels or ONNX Runtime's, and a feed."""
    model = tiny_model(365)
    path = tmp_path_factory.mktemp("fast") / "decoder.fast.onnx"
    export_fast_decoder(model, path, kernels=request.param)
    return model, path, fast_example(model, greedy=request.param == "attnserve")[0]


def test_attnserve_kernels_equal_onnxruntimes(tmp_path: Path) -> None:
    """service/_attention.c against ONNX Runtime's MultiHeadAttention and GroupQueryAttention on one graph's
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


class Projection(torch.nn.Module):
    """h (T, d) -> GreedyTokens of h W^T + bias, ``pad`` never chosen."""

    def __init__(self, W: torch.Tensor, bias: torch.Tensor, pad: int) -> None:
        super().__init__()
        for name, value in [("W", W), ("bias", bias), ("pad", torch.tensor(pad))]:
            self.register_buffer(name, value)
        for name, value in zip(("W_int8", "w_scale", "w_l1"), screen_weights(W), strict=True):
            self.register_buffer(name, value)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return GreedyTokens.apply(h, self.W, self.bias, self.W_int8, self.w_scale, self.w_l1, self.pad)


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
    path = tmp_path / "greedy.onnx"
    axes = {"h": {0: "rows"}, "tokens": {0: "rows"}}
    _export(Projection(torch.from_numpy(W), torch.from_numpy(bias), pad), (torch.from_numpy(h),), path,
            (["h"], ["tokens"]), axes, custom_opsets={KERNELS: 1})  # fmt: skip
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


def test_fast_decoder_reads_no_slot_past_a_rows_length(
    fast_decoder: tuple[Transformer, Path, dict[str, np.ndarray]],
) -> None:
    """The service leaves the slots of grown cache buffers unwritten (service/decoding.py, _Batch._moved): whatever
    they hold past each row's length, NaN and infinity included, the step is the same."""

    _, path, feed = fast_decoder
    lengths = feed["position_ids"][:, 0]
    session = kernel_session(path)
    steps = []
    for stale in (0.0, np.nan, np.inf):
        filled = {k: v.copy() for k, v in feed.items()}
        for name in (k for k in filled if k.startswith("past_")):
            for b, n in enumerate(lengths):
                filled[name][b, :, n:] = stale
        steps.append(session.run(["logits"], filled)[0])
    assert np.isfinite(steps[0]).all()
    np.testing.assert_array_equal(steps[1], steps[0])
    np.testing.assert_array_equal(steps[2], steps[0])


def test_fast_decoder_groups_rows_that_share_a_source(
    fast_decoder: tuple[Transformer, Path, dict[str, np.ndarray]],
) -> None:
    """G consecutive rows may share one source's cross keys and values (a beam request's rows): the same step as
    with the source repeated for each row; the first axis of the cross inputs is named apart from the rows'."""

    model, path, feed = fast_decoder  # 3 rows with 3 sources
    G, L = 2, model.config.n_decoder_layers
    cross = [f"cross_{kind}.{l}" for kind in ("keys", "values") for l in range(L)]
    rows = {k: np.repeat(v, G, axis=0) for k, v in feed.items() if k not in (*cross, "encoder_attention_mask")}
    rows["input_ids"] = np.arange(2, 2 + 3 * G)[:, None]  # different tokens in one source's rows
    rows.update({k: np.arange(3 * G) for k in ("logit_rows", "token_rows") if k in feed})  # every row's
    sources = {k: feed[k] for k in (*cross, "encoder_attention_mask")}
    session = kernel_session(path)
    repeated = session.run(None, {**rows, **{k: np.repeat(v, G, axis=0) for k, v in sources.items()}})
    grouped = session.run(None, {**rows, **sources})
    for want, got in zip(repeated, grouped, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dims = {i.name: i.type.tensor_type.shape.dim[0].dim_param for i in onnx.load(str(path)).graph.input}
    assert dims["input_ids"] != dims["encoder_attention_mask"] == dims["cross_keys.0"]


def test_float16_variant(spm: Path, tmp_path: Path) -> None:
    model = tiny_model(365)
    kwargs = dict(name="x", source_lang="en", target_lang="ja", tokenizer={"source": spm, "target": spm})
    bundle_dir = export_bundle(model, tmp_path / "b", **kwargs)  # type: ignore[arg-type]
    add_float16(bundle_dir)  # checked against PyTorch within FLOAT16_TOLERANCE
    bundle = load_bundle(bundle_dir)  # checks every file's sha256, the float16 graphs' included
    assert bundle.variants == ["float32", "float16"]
    graph = onnx.load(str(bundle.graph("decoder", "float16"))).graph
    assert onnx.TensorProto.FLOAT16 in {i.data_type for i in graph.initializer}
    assert all(o.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16 for o in graph.output)  # float32 outside
    src = bundle.tokenizer.encode_source("Open file")
    request = DecodeRequest(src=src, max_length=6, attention=True)
    exact = decode(Runner(bundle, "cpu"), [request])[0].hypotheses[0]
    half = Runner(bundle, "cpu", variant="float16")
    assert half.attention  # the exact graphs, converted: attention outputs included
    approx = decode(half, [request])[0].hypotheses[0]
    assert approx.tokens == exact.tokens
    np.testing.assert_allclose(approx.token_scores, exact.token_scores, atol=0.05)
    np.testing.assert_allclose(np.stack(approx.cross_attention), np.stack(exact.cross_attention), atol=0.02)
