"""Where a decoding step's time goes, for one runner: bench/gpu.py's per-step breakdown of the old runner (the exact
graphs through IOBinding: every logit and attention weight to the host, caches reordered by one-node sessions) and
the new one (the device decoder: reordering and token choice inside the step), and its CUDA-graph trial.

A step's wall time (``Batch.step``) is split by timing, around the service's own calls (unittest.mock wrappers,
nothing changed in service/):

- decoder run: the decoder session's ``run_with_iobinding`` (its kernels, and the transfers of bound host inputs and
  host-bound outputs that ONNX Runtime makes inside the call);
- copies: the rest of the runner's step (binding inputs and outputs, device values written, outputs read back as
  numpy);
- selection: turning the step's outputs into tokens (the logits' padding and log-normalizers, or the candidates;
  greedy argmax; beam ranking);
- reorder: beam rows continuing other rows' caches (one-node take/put sessions, or the next step's parent rows);
- the rest: the batch's bookkeeping around them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np

CATEGORIES = ("decoder run", "copies", "selection", "reorder", "the rest")


@dataclass
class StepTimes:
    """One runner's steps over a set of sentences at one beam size and batch size."""

    runner: str  # "old" or "new"
    variant: str
    beam: int
    batch: int
    steps: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0.0))

    def per_step_ms(self) -> dict[str, float]:
        """Each category's milliseconds a step, and their total."""
        n = max(self.steps, 1)
        out = {k: 1e3 * v / n for k, v in self.seconds.items()}
        return {**out, "step": sum(out.values())}


class _Clock:
    """Seconds spent inside wrapped calls, by name (a call inside another is counted in both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
                self.calls[name] = self.calls.get(name, 0) + 1

        return timed


@contextmanager
def _timed(runner: Any, clock: _Clock) -> Iterator[None]:
    """Wrap the calls that StepTimes' categories are made of, for ``runner``'s decoder."""
    from service.decoding import batch as batch_module
    from service.decoding.caches import Caches
    from service.decoding.gathered import GatheredCaches

    with ExitStack() as stack:

        def patch(owner: Any, attribute: str, name: str) -> None:
            stack.enter_context(mock.patch.object(owner, attribute, clock.wrap(name, getattr(owner, attribute))))

        patch(runner.decoder, "run_with_iobinding", "run")
        patch(runner.decoder, "run", "run")
        patch(type(runner), "step", "runner")
        patch(batch_module.Batch, "_choose", "selection")
        patch(batch_module, "beam_choose", "selection")
        patch(Caches, "move", "reorder")
        patch(GatheredCaches, "move", "reorder")
        patch(batch_module.Batch, "step", "step")
        yield


def measure(runner: Any, name: str, variant: str, sources: list[list[int]], beam: int, batch: int,
            max_length: int) -> StepTimes:  # fmt: skip
    """Decode ``sources`` with ``runner`` in batches of ``batch`` sorted by length, beam ``beam``, and split its
    steps' time (see the module's docstring)."""
    from engines import length_batches

    from service.decoding import DecodeRequest, decode

    clock = _Clock()
    with _timed(runner, clock):
        for idx in length_batches([len(s) for s in sources], batch):
            decode(runner, [DecodeRequest(src=sources[i], beam_size=beam, max_length=max_length, scores=False)
                            for i in idx])  # fmt: skip
    s = clock.seconds
    run, inside, selection, reorder = (s.get(k, 0.0) for k in ("run", "runner", "selection", "reorder"))
    times = StepTimes(name, variant, beam, batch, steps=clock.calls.get("step", 0))
    times.seconds = {
        "decoder run": run,
        "copies": inside - run,
        "selection": selection,
        "reorder": reorder,
        "the rest": s.get("step", 0.0) - inside - selection - reorder,
    }
    return times


def table(rows: Sequence[StepTimes]) -> str:
    """Milliseconds a step by category, one line a runner, variant, decoding and batch size."""
    lines = [
        "| runner | compute | decoding | batch | steps | " + " | ".join(CATEGORIES) + " | step (ms) |",
        "|---|---|---|---|---|" + "---|" * (len(CATEGORIES) + 1),
    ]
    for r in rows:
        ms = r.per_step_ms()
        decoding = "greedy" if r.beam == 1 else f"beam {r.beam}"
        cells = " | ".join(f"{ms[k]:.3f}" for k in (*CATEGORIES, "step"))
        lines.append(f"| {r.runner} | {r.variant} | {decoding} | {r.batch} | {r.steps} | {cells} |")
    return "\n".join(lines)


def cuda_graph_trial(bundle: Any, variant: str, provider: str, repeats: int = 50) -> dict[str, Any]:
    """ONNX Runtime's verdict on the device decoder with ``enable_cuda_graph``, and the latency of one batch-1 step
    with and without it. CUDA graphs replay one captured step: every input and output bound to device memory of
    fixed shapes, so the step runs at one past length (16 slots) and one source length (12 tokens); a step whose
    shapes change cannot be replayed. Without CUDA only the step without the option runs (``with`` not tried)."""
    import onnxruntime as ort

    from service.runtime.runner import CPU, CUDA, session_options

    path = str(bundle.graph("device_decoder", variant))
    results: dict[str, Any] = {"provider": provider, "shape": "1 row, 16 past slots, 12 source tokens"}
    for enabled in (False, True):
        key = "with" if enabled else "without"
        if enabled and provider != CUDA:
            results[key] = {"verdict": f"not tried: {provider} has no CUDA graphs"}
            continue
        options = {"use_tf32": "0", "enable_cuda_graph": "1" if enabled else "0"}
        providers: list[Any] = [(CUDA, options), CPU] if provider == CUDA else [CPU]
        try:
            session = ort.InferenceSession(path, session_options(1), providers=providers)
            seconds = _replayed_step(session, bundle.spec, "cuda" if provider == CUDA else "cpu", repeats)
        except Exception as e:  # ONNX Runtime's refusal is the result
            results[key] = {"verdict": f"refused: {type(e).__name__}: {str(e)[:300]}"}
            continue
        results[key] = {"verdict": "ran", "step_ms_median": 1e3 * statistics.median(seconds), "repeats": repeats}
    return results


def _replayed_step(session: Any, spec: Any, device: str, repeats: int) -> list[float]:
    """One batch-1 step of fixed shapes, every input and output bound to ``device`` values, run ``repeats`` times
    after a warm-up run (where a CUDA graph is captured); each run's seconds."""
    import onnxruntime as ort

    T, S, h, d_k, L = 16, 12, spec.h, spec.d_k, spec.n_decoder_layers
    types = {i.name: i.type for i in session.get_inputs()}
    dtype = np.float16 if types["cross_keys.0"] == "tensor(float16)" else np.float32
    rng = np.random.default_rng(0)
    host: dict[str, np.ndarray] = {
        "input_ids": np.array([[spec.decoder_start_id]]), "position_ids": np.array([[T]]),
        "parent_rows": np.zeros(1, np.int64), "source_rows": np.zeros(1, np.int64),
        "encoder_attention_mask": np.ones((1, S), np.int64), "candidates": np.array([8]),
    }  # fmt: skip
    for kind, length in (("cross_keys", S), ("cross_values", S), ("past_keys", T), ("past_values", T)):
        for l in range(L):
            host[f"{kind}.{l}"] = rng.standard_normal((1, h, length, d_k)).astype(dtype)
    binding = session.io_binding()
    for name, value in host.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
    shapes: dict[str, tuple[tuple[int, ...], Any]] = {
        "candidate_tokens": ((1, 8), np.int64), "candidate_logits": ((1, 8), np.float32),
        "log_norm": ((1,), np.float32), "tokens": ((1,), np.int64),
    }  # fmt: skip
    shapes |= {f"present_{kind}.{l}": ((1, h, T + 1, d_k), dtype) for kind in ("keys", "values") for l in range(L)}
    for name, (shape, element) in shapes.items():
        binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_shape_and_type(shape, element, device, 0))
    session.run_with_iobinding(binding)  # warm-up (and capture)
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        seconds.append(time.perf_counter() - t0)
    return seconds
