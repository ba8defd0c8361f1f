"""ONNX Runtime against PyTorch: the exported graphs' outputs compared on example feeds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from model.export.examples import decoder_feed, device_example, example_inputs, fast_example, forced_example
from model.export.graphs import DecoderGraph, EncoderGraph
from model.export.names import (
    ENCODER_INPUTS,
    FORCED_OUTPUTS,
    decoder_inputs,
    decoder_outputs,
    device_decoder_inputs,
    device_decoder_outputs,
    encoder_outputs,
    forced_inputs,
)
from model.transformer import Transformer
from service.runtime.kernels import kernel_session

TOLERANCE = 1e-4
# float16 keeps 11 significant bits: attention scores of tens round by hundredths and move a softmax weight by a few
# hundredths at most; a broken conversion is off by far more.
FLOAT16_TOLERANCE = 0.1


GRAPHS = ("encoder.onnx", "decoder.onnx")


def compare(names: list[str], got: Sequence[np.ndarray], want: Sequence[Tensor], tolerance: float) -> float:
    """The largest difference of any output, relative to the output's magnitude where that exceeds 1 (float32 sums
    of values near 10 differ by about 1e-5 · 10 between GEMM kernels); raises past ``tolerance``."""
    worst = 0.0
    for name, a, tensor in zip(names, got, want, strict=False):  # want may have more outputs (attention weights)
        b = tensor.numpy()
        scale = max(1.0, float(np.abs(b).max()))
        diff = float(np.abs(a - b).max()) / scale
        worst = max(worst, diff)
        if not diff <= tolerance:
            raise ValueError(
                f"ONNX Runtime differs from PyTorch on {name}: max abs {diff * scale:.3g} > {tolerance} × {scale:.3g}"
            )
    return worst


def check_graphs(
    model: Transformer, bundle_dir: Path, tolerance: float = TOLERANCE, graphs: tuple[str, str] = GRAPHS
) -> float:
    """Run both graphs (``graphs``: the encoder's and the decoder's file) in ONNX Runtime and in PyTorch on a
    padded batch; raise if any output differs by more than ``tolerance`` (max abs, relative to outputs larger than
    1: :func:`compare`). Returns the largest difference seen."""
    import onnxruntime as ort

    model = model.eval()
    L = model.config.n_decoder_layers
    ex = example_inputs(model.config, seed=1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    enc, dec = (ort.InferenceSession(str(bundle_dir / g), opts, providers=["CPUExecutionProvider"]) for g in graphs)
    enc_ort = enc.run(encoder_outputs(L), ex["encoder"])
    with torch.no_grad():
        enc_pt = EncoderGraph(model)(*(torch.from_numpy(ex["encoder"][k]) for k in ENCODER_INPUTS))
    dec_feed = decoder_feed(ex["decoder"], enc_ort[1:])  # the decoder runs on ONNX Runtime's own cross keys
    dec_ort = dec.run(decoder_outputs(L), dec_feed)
    with torch.no_grad():
        dec_pt = DecoderGraph(model)(*(torch.from_numpy(dec_feed[k]) for k in decoder_inputs(L)))
    return max(
        compare(encoder_outputs(L), enc_ort, enc_pt, tolerance),
        compare(decoder_outputs(L), dec_ort, dec_pt, tolerance),
    )


def check_fast_encoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Run the fast encoder at ``path`` on a padded batch with two texts packed in a row and compare its cross keys
    and values with PyTorch's exact encoder, within ``tolerance``. Returns the largest difference seen."""
    outputs = encoder_outputs(model.config.n_decoder_layers, fast=True)
    feed = example_inputs(model.config, seed=1)["encoder"]
    got = kernel_session(path).run(outputs, feed)
    with torch.no_grad():
        _, *want = EncoderGraph(model)(*(torch.from_numpy(feed[k]) for k in ENCODER_INPUTS))
    return compare(outputs, got, want, tolerance)


def check_fast_decoder(model: Transformer, path: Path, greedy: bool, tolerance: float = TOLERANCE) -> float:
    """Run the fast decoder at ``path`` as the runner runs it (its caches bound as input and output) and compare it
    with PyTorch's exact step on the same tokens: logits, and each row's cache slots, within ``tolerance``, and
    (``greedy``) tokens whose logits are the largest within it. Returns the largest difference seen."""
    import onnxruntime as ort

    L = model.config.n_decoder_layers
    names, outputs = decoder_inputs(L, fast=True, greedy=greedy), decoder_outputs(L, fast=True, greedy=greedy)
    feed, exact = fast_example(model, seed=1, greedy=greedy)
    session = kernel_session(path)
    binding = session.io_binding()
    presents = [name for name in outputs if name.startswith("present_")]
    for name in outputs[: -len(presents)]:
        binding.bind_output(name, "cpu")
    for name in names:
        value = ort.OrtValue.ortvalue_from_numpy(feed[name])
        binding.bind_ortvalue_input(name, value)
        if name.startswith("past_"):
            binding.bind_ortvalue_output(name.replace("past_", "present_"), value)  # in place, as the runner does
    session.run_with_iobinding(binding)
    with torch.no_grad():
        want = DecoderGraph(model)(*(torch.from_numpy(exact[k]) for k in decoder_inputs(L)))
    logits = binding.get_outputs()[0].numpy()
    if greedy:  # every row's logits and tokens were asked for
        check_greedy_tokens(binding.get_outputs()[1].numpy(), want[0].numpy(), model.config.pad_id, tolerance)
    lengths = exact["position_ids"][:, 0] + 1  # each row's slots after the step
    T = exact["past_keys.0"].shape[2]
    got, ragged = [logits], [want[0]]
    for i, name in enumerate(presents):
        buffer = feed[name.replace("present_", "past_")]
        got += [buffer[b, :, :n] for b, n in enumerate(lengths)]
        ragged += [want[1 + i][b, :, T + 1 - n :] for b, n in enumerate(lengths)]
    return compare(["logits"] + [f"cache slots of row {b}" for b in range(len(got) - 1)], got, ragged, tolerance)


def check_greedy_tokens(tokens: np.ndarray, logits: np.ndarray, pad_id: int, tolerance: float) -> None:
    """Raise unless each row's token in ``tokens`` has a logit (PyTorch's ``logits`` (B, V)) within ``tolerance``
    (relative to logits larger than 1) of the row's largest, padding left out."""
    allowed = logits.copy()  # (B, V)
    allowed[:, pad_id] = -np.inf
    chosen = allowed[np.arange(len(tokens)), tokens]
    scale = np.maximum(1.0, np.abs(allowed).max(axis=1, where=np.isfinite(allowed), initial=0))
    if not ((allowed.max(axis=1) - chosen) / scale <= tolerance).all():
        raise ValueError(f"ONNX Runtime's greedy tokens {tokens.tolist()} are not PyTorch's argmax")


def stepped_cross_attention(model: Transformer, feed: dict[str, np.ndarray]) -> np.ndarray:
    """PyTorch's cross-attention of :class:`DecoderGraph` stepping through a forced feed's decoder inputs one
    position at a time on its cache: (L, B, h, T, S), as the forced graph gives it."""
    L, c = model.config.n_decoder_layers, model.config
    ids = torch.from_numpy(feed["input_ids"])
    B, T = ids.shape
    cross = [torch.from_numpy(feed[f"{kind}.{l}"]) for kind in ("cross_keys", "cross_values") for l in range(L)]
    past = [torch.zeros(B, c.h, 0, c.d_k) for _ in range(2 * L)]
    graph, rows = DecoderGraph(model), []
    with torch.no_grad():
        for t in range(T):
            out = graph(ids[:, t : t + 1], torch.full((B, 1), t), torch.from_numpy(feed["encoder_attention_mask"]),
                        torch.ones(B, t + 1, dtype=torch.long), *cross, *past)  # fmt: skip
            past = list(out[1 : 1 + 2 * L])
            rows.append(out[-1])  # (L, B, h, S)
    return torch.stack(rows, dim=3).numpy()


def check_forced_decoder(model: Transformer, path: Path, tolerance: float = TOLERANCE) -> float:
    """Run the forced decoder at ``path`` in ONNX Runtime on rows of different target lengths (padded after) and
    compare each row's positions with PyTorch stepping through the same tokens (:func:`stepped_cross_attention`),
    within ``tolerance``. Returns the largest difference seen."""
    feed, lengths = forced_example(model, seed=1)
    names = forced_inputs(model.config.n_decoder_layers)
    got = kernel_session(path).run(FORCED_OUTPUTS, {k: feed[k] for k in names})[0]  # (L, B, h, T, S)
    want = stepped_cross_attention(model, feed)
    rows = [f"cross_attentions of row {b}" for b in range(len(lengths))]
    return compare(rows, [got[:, b, :, :n] for b, n in enumerate(lengths)],
                   [torch.from_numpy(want[:, b, :, :n]) for b, n in enumerate(lengths)], tolerance)  # fmt: skip


def check_device_decoder(model: Transformer, path: Path, tolerance: float = TOLERANCE, candidates: int = 8) -> float:
    """Run the device decoder at ``path`` in ONNX Runtime on the CPU (:func:`~model.export.examples.device_example`:
    rows reordered onto their parents' caches, beams sharing sources; float inputs in the graph's own type) and
    compare it with PyTorch's exact step on the same rows, gathered by hand: each row's ``candidates`` best logits
    (and the logits of the tokens it names), its log normalizer, a greedy token whose logit is the largest, and
    the present keys and values, within ``tolerance``. Returns the largest difference seen."""
    import onnxruntime as ort

    L, pad_id = model.config.n_decoder_layers, model.config.pad_id
    feed, exact = device_example(model, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    half = session.get_inputs()[device_decoder_inputs(L).index("past_keys.0")].type == "tensor(float16)"
    feed = {k: v.astype(np.float16) if half and v.dtype == np.float32 else v for k, v in feed.items()}
    outputs = device_decoder_outputs(L)
    got = session.run(outputs, {**feed, "candidates": np.array([candidates], np.int64)})
    with torch.no_grad():
        logits, *presents = DecoderGraph(model)(*(torch.from_numpy(exact[k]) for k in decoder_inputs(L)))[: 1 + 2 * L]
    scores = logits.numpy().copy()
    scores[:, pad_id] = -np.inf
    tokens, values, log_norm, greedy = got[:4]
    check_greedy_tokens(greedy, scores, pad_id, tolerance)
    best = -np.sort(-scores, axis=1)[:, :candidates]
    return compare(
        ["candidate_logits", "logits of the candidate tokens", "log_norm", *outputs[4:]],
        [values, np.take_along_axis(scores, tokens, axis=1), log_norm, *(p.astype(np.float32) for p in got[4:])],
        [torch.from_numpy(best), torch.from_numpy(values), torch.logsumexp(torch.from_numpy(scores), 1), *presents],
        tolerance,
    )
