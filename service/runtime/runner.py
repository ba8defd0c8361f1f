"""ONNX Runtime sessions of one bundle: token ids in, logits, caches and attention weights out. No HTTP here.

One runner class a decoder form, each the :class:`~service.decoding.step_runner.StepRunner` of one cache layout
(service/decoding/): :class:`AppendedRunner` (the exact graphs, attention outputs and the forced decoder),
:class:`InPlaceRunner` (the fast and int8 graphs, caches written in place) and :class:`GatheredRunner` (the device
decoder, candidates instead of logits); :func:`open_runner` picks one from the graph's form in the bundle's manifest.
A step takes one :class:`StepInput`. The key/value caches are the runner's own kind of array
(:data:`~service.runtime.tensors.Cache`): numpy arrays on the CPU, or, with IOBinding (the default on CUDA), ONNX
Runtime values that stay on the device from one decoding step to the next (service/runtime/tensors.py).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import onnxruntime as ort

from service.runtime.bundle import Bundle, GraphForm
from service.runtime.kernels import attention_library
from service.runtime.providers import CPU, CUDA, Provider, choose_provider, cuda_options
from service.runtime.tensors import Cache, DeviceTensors, HostTensors, Tensors

log = logging.getLogger(__name__)

SELECTION = ("candidate_tokens", "candidate_logits", "log_norm", "tokens")  # the device decoder's host outputs


@functools.cache
def tune_memory() -> bool:
    """Process-wide memory settings for decoding (once per process); returns whether every one applied.

    glibc's malloc keeps freed memory for reuse instead of returning it to the system. Every decoding step allocates
    caches and logits of a few megabytes and frees the previous ones; by default glibc hands such blocks back to the
    kernel (mmap and trim thresholds that adapt) and the next step faults fresh pages in. Here arrays up to 32 MiB
    come from the heap, and up to 256 MiB of freed heap stays mapped: far fewer page faults (glibc only; elsewhere
    nothing changes; docs/BENCHMARKS.md). All threads share one malloc arena: the decoding, event-loop and worker
    threads free each other's arrays, and with an arena per thread each arena keeps its own free memory, so
    resident memory creeps up under steady load.

    And numpy does not ask Linux for 2 MiB pages for arrays of 4 MiB or more (``NUMPY_MADVISE_HUGEPAGE=0``, which
    numpy reads only when it is imported): such a page is zeroed whole when one byte of it is first written, and the
    self-attention buffers are mostly slots that no row reaches (their capacity follows the longest row), so growing
    a batch's buffers would fault in whole huge pages whenever the heap grows.
    """
    try:
        multiarray = importlib.import_module("numpy._core.multiarray")  # numpy 2
    except ImportError:
        multiarray = importlib.import_module("numpy.core.multiarray")  # numpy 1.26
    hugepages = getattr(multiarray, "_set_madvise_hugepage", None)
    if hugepages is not None:
        hugepages(False)
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc: macOS, Windows, musl
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # <malloc.h>
    settings = (
        (M_MMAP_THRESHOLD, 32 << 20),
        (M_TRIM_THRESHOLD, 256 << 20),
        (M_TOP_PAD, 64 << 20),
        (M_ARENA_MAX, 1),
    )
    return all(mallopt(option, value) == 1 for option, value in settings) and hugepages is not None


def trim_memory() -> bool:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``, every arena); whether it did.

    :func:`tune_memory` keeps freed memory mapped so that decoding steps reuse it; after a burst that keeps the
    burst's peak resident for good. The engine's memory budget (service/serving/budget.py) calls this once nothing has
    been
    in flight a while, and now and then under steady load, so that the steps' faulting pages in again stays rare.
    """
    try:
        malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(malloc_trim(0))


def session_options(threads: int) -> ort.SessionOptions:
    """The options of every session: ``threads`` intra-op threads that sleep when they wait, attnserve's kernels,
    and no CPU memory arena."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # ONNX Runtime's arena grows to the largest batch ever seen and never shrinks; malloc's free memory goes back
    # to the system with trim_memory, and decoding is no slower without the arena.
    opts.enable_cpu_mem_arena = False
    # Waiting threads sleep instead of spinning: a spinning pool collapses when another process holds a core.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.register_custom_ops_library(attention_library())  # the fast decoder's attention (domain attnserve)
    return opts


@dataclass(frozen=True, slots=True)
class StepInput:
    """One decoder step's inputs for B rows (docs/ARCHITECTURE.md for the shapes): the rows, the sources they read and
    their caches, then the fields of one decoder form each (:func:`open_runner`). Host caches should be C-contiguous
    (:class:`HostTensors` keeps them so), or ONNX Runtime copies them."""

    input_ids: np.ndarray  # (B, 1) int64: each row's last token
    position_ids: np.ndarray  # (B, 1) int64: its position (0 for the start token)
    encoder_attention_mask: np.ndarray  # (J, S) int64: the cross rows' sources (J = B unless cross rows are shared)
    cross_keys: list[Cache]  # per decoder layer (J, h, S, d_k)
    cross_values: list[Cache]
    past_keys: list[Cache]  # per decoder layer (B, h, T, d_k); gathered: (P, h, T, d_k), read through parent_rows
    past_values: list[Cache]
    self_attention_mask: np.ndarray | None = None  # appended caches: (B, T + 1), the slots each row owns
    # in-place caches, greedy_tokens graphs: the rows (ascending) that take the graph's greedy token instead of their
    # logits; the others get logits (None: every row)
    token_rows: np.ndarray | None = None
    parent_rows: np.ndarray | None = None  # gathered caches: (B,) each row's past row
    source_rows: np.ndarray | None = None  # gathered caches: (B,) each row's cross row
    candidates: int = 0  # gathered caches: the best tokens each row gives (K)


@dataclass(frozen=True)
class EncoderOutput:
    attentions: np.ndarray | None  # (L_enc, B, h, S, S); None from a graph without attention outputs
    cross_keys: list[Cache]  # per decoder layer (B, h, S, d_k)
    cross_values: list[Cache]


@dataclass(frozen=True)
class Candidates:
    """A device decoder step's selection (model/export/selection.py): each row's K best tokens instead of its
    logits."""

    tokens: np.ndarray  # (B, K) int64: best first, the lower token first among equal logits; never padding
    logits: np.ndarray  # (B, K) float32: their logits
    log_norm: np.ndarray  # (B,) float32: log sum exp of the row's logits (log p = logit - log_norm)


@dataclass(frozen=True)
class StepOutput:
    # (B, V); (0, V) when every row took the graph's greedy token, or the step gave candidates; when some rows did,
    # theirs hold nothing
    logits: np.ndarray
    present_keys: list[Cache]  # per decoder layer (B, h, T + 1, d_k)
    present_values: list[Cache]
    self_attentions: np.ndarray | None  # (L_dec, B, h, T + 1); None from a graph without attention outputs
    cross_attentions: np.ndarray | None  # (L_dec, B, h, S)
    tokens: np.ndarray | None = None  # (B,) greedy tokens at the rows that asked for them (every row's with candidates)
    candidates: Candidates | None = None  # from a device decoder (GatheredRunner)


DecoderRole = Literal["decoder", "fast_decoder", "device_decoder"]


class Runner(ABC):
    """The encoder and decoder-step sessions of one bundle: what every decoder form shares. Its subclasses are the
    forms, one each, picked by :func:`open_runner` from the decoder graph's cache layout.

    Args:
        bundle: the bundle.
        provider: ``auto``, ``cpu`` or ``cuda`` (:func:`choose_provider`).
        threads: intra-op threads of each session (0: ONNX Runtime's choice).
        variant: the graph variant (``float32``, ``int8``, ``float16``).
        role: the decoder graph: ``decoder`` (the variant's own), ``fast_decoder`` (float32's, caches written in
            place) or ``device_decoder`` (the variant's, caches gathered inside the step).
        io_binding: keep the caches on the device between steps (:class:`DeviceTensors`); default: on CUDA.
            On the CPU it only adds work, but it runs the same code path, which is how the tests check it.
            A :class:`GatheredRunner`'s caches are always device values.
        encoder: another runner's encoder session of the same graph, to share (float32's exact and fast runners
            encode alike; a second session would hold the weights twice).
        gpu_mem_limit_mb: on CUDA, the bound on each session's device memory arena (0: none).
    """

    layout: ClassVar[str]  # the decoder graph's cache layout (GraphForm.cache) that this class runs
    device_caches: ClassVar[bool] = False  # its caches are device values whatever io_binding says

    def __init__(
        self,
        bundle: Bundle,
        provider: Provider = "auto",
        threads: int = 1,
        variant: str = "float32",
        role: DecoderRole = "decoder",
        io_binding: bool | None = None,
        encoder: ort.InferenceSession | None = None,
        gpu_mem_limit_mb: int = 0,
    ) -> None:
        tune_memory()
        self.bundle = bundle
        self.variant = variant
        self.spec = bundle.spec
        self.provider = choose_provider(provider)
        self.form: GraphForm = bundle.form(role, variant)
        assert self.form.cache == self.layout, f"{role} ({variant}) has {self.form.cache} caches, not {self.layout}"
        self._options = session_options(threads)
        cuda = (CUDA, cuda_options(gpu_mem_limit_mb))
        self._providers: list[Any] = [CPU] if self.provider == CPU else [cuda, CPU]
        self.encoder = encoder or self._session("encoder")
        self.decoder = self._session(role)
        self.io_binding = self.device_caches or (self.provider == CUDA if io_binding is None else io_binding)
        self.device = "cuda" if self.provider == CUDA else "cpu"
        self._device_tensors = (
            DeviceTensors(self._providers, self.device, self._options, self._cache_dtype()) if self.io_binding else None
        )
        self.tensors: Tensors = self._device_tensors or HostTensors()
        L = self.spec.n_decoder_layers
        self.encoder_form = bundle.form("encoder", variant)
        # The int8 variant's fast encoder and decoder give no attention weights, nor do the fast and device decoders:
        # requests that want them go to the exact graphs (service/serving/engine.py), and their encoder attentions
        # are not fetched.
        self.attention = self.encoder_form.attentions and self.form.attentions
        outputs = [o.name for o in self.encoder.get_outputs()]  # encoder_attentions first, where it has them
        self._encoder_outputs = outputs[1:] if self.encoder_form.attentions and not self.attention else outputs
        self._caches = {f"{kind}.{l}" for kind in ("cross_keys", "cross_values", "present_keys", "present_values")
                        for l in range(L)}  # fmt: skip
        self._setup()
        log.info(
            "bundle %s (%s, %s) on %s (%d intra-op threads%s)",
            bundle.name,
            variant,
            role,
            self.provider,
            threads,
            ", IOBinding" if self.io_binding else "",
        )

    def _session(self, role: str) -> ort.InferenceSession:
        """A session of the variant's graph of ``role`` on this runner's providers."""
        # On the CPU, LayerNormalization after a plain Add beats the fused SkipLayerNormalization kernel (a decoder
        # step takes less time, float32 and int8; docs/BENCHMARKS.md).
        disabled = ["SkipLayerNormFusion"] if self.provider == CPU else None
        path = str(self.bundle.graph(role, self.variant))
        return ort.InferenceSession(path, self._options, providers=self._providers, disabled_optimizers=disabled)

    def _cache_dtype(self) -> type[np.floating[Any]]:
        """The caches' dtype as device values."""
        return np.float32

    @abstractmethod
    def _setup(self) -> None:
        """The form's own set-up, once the sessions and tensors are."""

    def _run(self, session: ort.InferenceSession, outputs: list[str], feed: dict[str, Any]) -> list[Any]:
        """Run a session; with IOBinding, cache outputs stay on the device and the rest come back as numpy."""
        if not self.io_binding:
            values: list[Any] = session.run(outputs, feed)
            return values
        binding = session.io_binding()
        for name, value in feed.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, value)
        for name in outputs:
            binding.bind_output(name, self.device if name in self._caches else "cpu")
        session.run_with_iobinding(binding)
        values = binding.get_outputs()
        return [v if name in self._caches else v.numpy() for name, v in zip(outputs, values, strict=True)]

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        """input_ids, attention_mask, position_ids (B, S) int64 -> encoder attentions and each decoder layer's cross
        keys/values (no attentions from a runner whose decoder gives none). attention_mask numbers the texts of a row
        (0: padding); a text's positions start at 0. Cross keys and values come in the caches' dtype."""
        feed = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        outputs = self._run(self.encoder, self._encoder_outputs, feed)
        attentions = outputs.pop(0) if self.attention else None
        if self._device_tensors is not None:  # a float16 device decoder's cross caches, cast once here
            outputs = [self._device_tensors.convert(x) for x in outputs]
        L = self.spec.n_decoder_layers
        return EncoderOutput(attentions, outputs[:L], outputs[L:])

    @abstractmethod
    def step(self, step: StepInput) -> StepOutput:
        """One decoding step for B rows, as this form takes them."""


class AppendedRunner(Runner):
    """Caches appended (decoder.onnx: float32's exact graph, with attention outputs; float16's): past caches in,
    presents one slot longer out, under a self-attention mask. float32's runner also holds the forced decoder, when
    the bundle has one (:meth:`cross_attention`)."""

    layout = "appended"

    def _setup(self) -> None:
        L = self.spec.n_decoder_layers
        self._decoder_outputs = [o.name for o in self.decoder.get_outputs()]
        # The forced decoder: cross-attention of finished hypotheses in one call (cross_attention).
        forced = self.variant == "float32" and self.bundle.has_graph("forced_decoder")
        self.forced = self._session("forced_decoder") if forced else None
        self._forced_inputs = [i.name for i in self.forced.get_inputs()] if self.forced is not None else []
        self._cache_inputs = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values", "past_keys", "past_values")
                              for l in range(L)]  # fmt: skip

    def step(self, step: StepInput) -> StepOutput:
        """The exact step: row b owns the slots of the past caches that ``self_attention_mask[b]`` marks, and the
        new one; presents (B, h, T + 1, d_k) and, from a graph that gives them, the attention weights."""
        assert step.self_attention_mask is not None, "appended caches take a self-attention mask"
        caches = (*step.cross_keys, *step.cross_values, *step.past_keys, *step.past_values)
        feed: dict[str, Any] = {
            "input_ids": step.input_ids,
            "position_ids": step.position_ids,
            "encoder_attention_mask": step.encoder_attention_mask,
            "self_attention_mask": step.self_attention_mask,
            **dict(zip(self._cache_inputs, caches, strict=True)),
        }
        logits, *rest = self._run(self.decoder, self._decoder_outputs, feed)
        L = self.spec.n_decoder_layers
        self_attentions, cross_attentions = rest[2 * L :] if self.attention else (None, None)
        return StepOutput(logits, rest[:L], rest[L : 2 * L], self_attentions, cross_attentions)

    @property
    def has_forced(self) -> bool:
        """Whether :meth:`cross_attention` can run: the bundle has a forced decoder and this runner is float32's."""
        return self.forced is not None

    def cross_attention(self, sources: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]:
        """The cross-attention that decoding ``targets[b]`` (generated ids, ``</s>`` included) from ``sources[b]``
        gave at each step, from the exact encoder and one forced-decoder call: per row (T_b, L, h, S_b), its step
        t the weights of the step that produced ``targets[b][t]``, as the exact step graph gives them."""
        assert self.forced is not None, "this runner has no forced decoder"
        spec, B = self.spec, len(sources)
        S, T = max(map(len, sources)), max(1, *map(len, targets))
        src = np.full((B, S), spec.pad_id, np.int64)
        mask = np.zeros((B, S), np.int64)
        ids = np.full((B, T), spec.pad_id, np.int64)
        for b, (source, target) in enumerate(zip(sources, targets, strict=True)):
            src[b, : len(source)], mask[b, : len(source)] = source, 1
            ids[b, 0], ids[b, 1 : len(target)] = spec.decoder_start_id, target[:-1]  # the step inputs: start first
        enc = self.encode(src, mask, np.tile(np.arange(S), (B, 1)))
        L = spec.n_decoder_layers
        cross = {f"{kind}.{l}": layers[l] for kind, layers in (("cross_keys", enc.cross_keys),
                 ("cross_values", enc.cross_values)) for l in range(L)}  # fmt: skip
        feed = {"input_ids": ids, "position_ids": np.tile(np.arange(T), (B, 1)), "encoder_attention_mask": mask,
                **cross}  # fmt: skip
        (weights,) = self._run(self.forced, ["cross_attentions"], {k: feed[k] for k in self._forced_inputs})
        return [
            np.ascontiguousarray(weights[:, b, :, : len(t), : len(s)].transpose(2, 0, 1, 3))  # (T_b, L, h, S_b)
            for b, (s, t) in enumerate(zip(sources, targets, strict=True))
        ]


class _ThreadBindings:
    """Each thread's IOBinding of a decoder session and what is bound to it, kept from step to step (schedulers on
    several threads share a runner)."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session
        self._local = threading.local()

    def get(self) -> tuple[ort.IOBinding, dict[str, Any]]:
        state: tuple[ort.IOBinding, dict[str, Any]] | None = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = (self._session.io_binding(), {})
        return state


class InPlaceRunner(Runner):
    """Caches written in place (decoder.fast.onnx, the int8 graphs; attnserve's kernels, no attention outputs): row
    b's ``position_ids[b]`` tokens sit at the start of its cache buffers (docs/ARCHITECTURE.md, "caches written in
    place"), whose cross rows may serve G consecutive rows each (``form.grouped_cross``); a graph of
    ``form.greedy_tokens`` gives each row's greedy token instead of its logits where asked."""

    layout = "in_place"

    def _setup(self) -> None:
        L = self.spec.n_decoder_layers
        self.greedy_tokens = self.form.greedy_tokens
        self._bindings = _ThreadBindings(self.decoder)
        # Its inputs in the order step passes them, and its (past, present) cache pairs.
        cross = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values") for l in range(L)]
        self._inputs = ("input_ids", "position_ids", "encoder_attention_mask", *cross)
        self._cache_pairs = [(f"past_{kind}.{l}", f"present_{kind}.{l}") for kind in ("keys", "values")
                             for l in range(L)]  # fmt: skip

    def step(self, step: StepInput) -> StepOutput:
        """Each cache buffer bound as its past input and its present output: the step writes its slots into them
        (buffers of any capacity beyond the longest row) and returns them as the presents, with the logits, or
        greedy tokens for ``step.token_rows`` and the other rows' logits, in this thread's arrays, overwritten by its
        next step.

        A decoding thread keeps its binding from step to step and binds again only what changed (the buffers stay
        the same arrays until they grow, shrink or rows join): binding everything anew costs time every step."""
        binding, bound = self._bindings.get()
        inputs = (step.input_ids, step.position_ids, step.encoder_attention_mask, *step.cross_keys, *step.cross_values)
        for name, value in zip(self._inputs, inputs, strict=True):
            if bound.get(name) is not value:
                if isinstance(value, ort.OrtValue):
                    binding.bind_ortvalue_input(name, value)
                else:
                    binding.bind_cpu_input(name, value)  # the array's own memory, not a copy
                bound[name] = value
        for (past, present), cache in zip(self._cache_pairs, (*step.past_keys, *step.past_values), strict=True):
            if bound.get(past) is not cache:
                value = cache if isinstance(cache, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(cache)
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
                bound[past] = cache
        B, token_rows = len(step.input_ids), step.token_rows
        rows = (B, None if token_rows is None else token_rows.tobytes())
        if bound.get("rows") != rows:
            self._bind_rows(binding, bound, B, token_rows)
            bound["rows"] = rows
        self.decoder.run_with_iobinding(binding)
        if token_rows is None:
            return StepOutput(bound["logits"], step.past_keys, step.past_values, None, None)
        logits, logit_rows = bound["logits"], bound["logit_rows"]
        if len(logit_rows):  # the other rows' logits, each at its row of the batch
            every = bound["every_logit"]
            every[logit_rows] = logits
            logits = every
        chosen = bound["chosen"]
        chosen[token_rows] = bound["tokens"]
        return StepOutput(logits, step.past_keys, step.past_values, None, None, chosen)

    def _bind_rows(self, binding: ort.IOBinding, bound: dict[str, Any], B: int, token_rows: np.ndarray | None) -> None:
        """Bind this thread's arrays for the logits of the rows that take no greedy token and, on a graph that takes
        them, the rows of logits and of greedy tokens and the tokens' array; again only when B or the token rows
        change (the caller keeps which rows it bound)."""
        assert self.greedy_tokens or token_rows is None, "this fast decoder gives logits only"
        T = np.zeros(0, np.int64) if token_rows is None else np.ascontiguousarray(token_rows, np.int64)
        R = np.setdiff1d(np.arange(B, dtype=np.int64), T, assume_unique=True)
        V = self.spec.vocab_size
        logits = np.empty((len(R), V), np.float32)
        binding.bind_output("logits", "cpu", 0, np.float32, logits.shape, logits.ctypes.data)
        chosen = None
        if self.greedy_tokens:
            binding.bind_cpu_input("logit_rows", R)
            binding.bind_cpu_input("token_rows", T)
            chosen = np.empty(len(T), np.int64)
            binding.bind_output("tokens", "cpu", 0, np.int64, chosen.shape, chosen.ctypes.data)
        bound.update(
            logit_rows=R,
            token_rows=T,
            logits=logits,
            tokens=chosen,
            every_logit=np.empty((B, V), np.float32) if len(R) and len(T) else None,
            chosen=np.zeros(B, np.int64),
        )


class GatheredRunner(Runner):
    """Caches gathered inside the step (the variant's device decoder, standard operators): each row's past caches
    read through ``parent_rows`` and its cross caches through ``source_rows``, each row's candidates instead of
    logits. Its caches are always device values (IOBinding), on the CPU too (how the tests and bench/gpu.py run it
    there); a float16 device decoder's are float16."""

    layout = "gathered"
    device_caches = True

    def _setup(self) -> None:
        L = self.spec.n_decoder_layers
        self._bindings = _ThreadBindings(self.decoder)
        # Its cache inputs in the order step passes them, and its presents.
        self._cache_inputs = [f"{kind}.{l}" for kind in ("cross_keys", "cross_values", "past_keys", "past_values")
                              for l in range(L)]  # fmt: skip
        self._presents = [f"present_{kind}.{l}" for kind in ("keys", "values") for l in range(L)]

    def _cache_dtype(self) -> type[np.floating[Any]]:
        """float16 where the graph's cache inputs say so."""
        types = {i.name: i.type for i in self.decoder.get_inputs()}
        return np.float16 if types["cross_keys.0"] == "tensor(float16)" else np.float32

    def step(self, step: StepInput) -> StepOutput:
        """Row b gathers the past caches of past row ``parent_rows[b]`` and the cross caches and mask of source
        ``source_rows[b]``, owns the last ``position_ids[b]`` slots of the past caches, and gives its
        ``candidates`` best tokens (:class:`Candidates`) and its greedy token; the presents stay on the device
        (B, h, T + 1, d_k).

        A decoding thread keeps one binding from step to step: the row inputs are device values written in place
        while their shapes stay, the encoder mask and the caches are bound again only when they are other values
        (a new mask is a new array), and the host outputs are this thread's arrays, overwritten by its next step."""
        assert step.parent_rows is not None and step.source_rows is not None, "gathered caches take rows"
        binding, bound = self._bindings.get()
        rows = {"input_ids": step.input_ids, "position_ids": step.position_ids, "parent_rows": step.parent_rows,
                "source_rows": step.source_rows, "candidates": np.array([step.candidates], np.int64)}  # fmt: skip
        for name, value in rows.items():
            self._bind_device_input(binding, bound, name, np.ascontiguousarray(value, np.int64))
        mask = step.encoder_attention_mask
        if bound.get("encoder_attention_mask") is not mask:
            self._bind_device_input(binding, bound, "encoder_attention_mask", np.ascontiguousarray(mask, np.int64))
            bound["encoder_attention_mask"] = mask
        caches = (*step.cross_keys, *step.cross_values, *step.past_keys, *step.past_values)
        for name, cache in zip(self._cache_inputs, caches, strict=True):
            if bound.get(name) is not cache:
                binding.bind_ortvalue_input(name, cache)
                bound[name] = cache
        B = len(step.input_ids)
        if bound.get("selected") != (B, step.candidates):
            self._bind_selection(binding, bound, B, step.candidates)
        for name in self._presents:  # a new value each step: the next step reads this one's
            binding.bind_output(name, self.device)
        self.decoder.run_with_iobinding(binding)
        presents = binding.get_outputs()[len(SELECTION) :]
        L = self.spec.n_decoder_layers
        chosen = Candidates(bound["candidate_tokens"], bound["candidate_logits"], bound["log_norm"])
        empty = np.empty((0, self.spec.vocab_size), np.float32)
        return StepOutput(empty, presents[:L], presents[L:], None, None, bound["tokens"], chosen)

    def _bind_device_input(self, binding: ort.IOBinding, bound: dict[str, Any], name: str, value: np.ndarray) -> None:
        """Bind a host array as input ``name``, a device value of this thread's: the one bound before, written over,
        while the shape stays."""
        held: ort.OrtValue | None = bound.get(f"device.{name}")
        if held is not None and held.shape() == list(value.shape):
            held.update_inplace(value)
            return
        held = bound[f"device.{name}"] = ort.OrtValue.ortvalue_from_numpy(value.copy(), self.device, 0)  # its own
        binding.bind_ortvalue_input(name, held)

    def _bind_selection(self, binding: ort.IOBinding, bound: dict[str, Any], B: int, K: int) -> None:
        """Bind this thread's host arrays for the selection outputs of B rows of K candidates, in SELECTION's order
        and before the presents (:meth:`step` reads the presents after them)."""
        shapes = {"candidate_tokens": (B, K), "candidate_logits": (B, K), "log_norm": (B,), "tokens": (B,)}
        for name in SELECTION:
            array = np.empty(shapes[name], np.int64 if "tokens" in name else np.float32)
            binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
            bound[name] = array
        bound["selected"] = (B, K)


# Each runner class by the cache layout that it runs (GraphForm.cache).
FORMS: dict[str, type[Runner]] = {form.layout: form for form in (AppendedRunner, InPlaceRunner, GatheredRunner)}


def open_runner(
    bundle: Bundle,
    provider: Provider = "auto",
    threads: int = 1,
    variant: str = "float32",
    role: DecoderRole = "decoder",
    io_binding: bool | None = None,
    encoder: ort.InferenceSession | None = None,
    gpu_mem_limit_mb: int = 0,
) -> Runner:
    """The runner of the variant's ``role`` decoder graph, of the class its cache layout asks for (the arguments
    are :class:`Runner`'s).

    Raises:
        BundleError: the bundle has no such graph.
    """
    cls = FORMS[str(bundle.form(role, variant).cache)]
    return cls(bundle, provider, threads, variant, role, io_binding, encoder, gpu_mem_limit_mb)
