"""One language pair: a bundle's tokenizer, its runners and their schedulers. Texts and options in, translations
and attention weights out; the HTTP API and the command line share it, so both give the same answers.

It speaks the domain only: it raises service.errors and returns the dataclasses below, which service/http shapes
into JSON.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from service.admission import check_servable
from service.budget import Budget, MiB, answer_bytes, request_bytes
from service.bundle import Bundle, load_bundle, unencodable
from service.confidence import Calibration, Evidence, coverage, is_content
from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, Hypothesis, StepRunner, decode
from service.errors import ClientGone, InvalidText, NoSuchIndex, TooLarge
from service.runner import CPU, Runner, trim_memory
from service.scheduler import DeadlineExceeded, Scheduler, StepStats
from service.settings import Settings
from service.text.glossary import read_glossary
from service.text.pipeline import Prepared, TextPipeline

log = logging.getLogger(__name__)

KINDS = ("encoder", "decoder", "cross")
Gone = Callable[[], Awaitable[bool]]  # whether the caller went away (Starlette's Request.is_disconnected)


@dataclass(frozen=True)
class Options:
    """Decoding options of one request.

    Args:
        beam_size: 1 = greedy.
        max_length: generated tokens at most; default min(settings.max_length, 2 × source tokens + 10).
        alternatives: extra translations wanted; the beam widens to at least alternatives + 1.
        length_penalty: finished beam hypotheses rank by score / length^length_penalty.
        details: add tokens, scores and a cross-attention alignment to each translation.
        glossary: source term → target term, enforced where a term occurs (service/text/).
        keep: terms copied verbatim.
    """

    beam_size: int = 1
    max_length: int | None = None
    alternatives: int = 0
    length_penalty: float = 1.0
    details: bool = False
    glossary: Mapping[str, str] | None = None
    keep: tuple[str, ...] = ()

    @property
    def beam(self) -> int:
        """The beam that decodes: ``beam_size``, widened to give the alternatives."""
        return max(self.beam_size, self.alternatives + 1)


@dataclass(frozen=True)
class Filters:
    """Which attention weights to return: kinds (subset of :data:`KINDS`), layer and head indices (None = all)."""

    kinds: Sequence[str] = KINDS
    layers: list[int] | None = None
    heads: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Details:
    """One translation's tokens, log-probabilities (six decimals) and word alignment: each target token's most
    attended source token, last layer, heads averaged; each source token's coverage (the most attention any step
    gave it, service/confidence.py), the calibrated confidence and the flags."""

    source_tokens: list[str]
    tokens: list[str]
    score: float
    token_scores: list[float]
    alignment: list[int]
    coverage: list[float] = field(default_factory=list)
    confidence: float | None = None
    flags: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Translation:
    """One text's translation, its alternatives (texts that read differently, best first) and, if asked, details."""

    text: str
    alternatives: list[str]
    details: Details | None


@dataclass(frozen=True)
class AttentionResult:
    """A translation with its attention weights, [layer][head][query][key] per kind, rounded to six decimals.

    Query t of decoder and cross attention is the step that produced ``target_tokens[t]`` from
    ``decoder_input_tokens[t]``; decoder self-attention is 0 above the diagonal.
    """

    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    text: str
    heads: list[int]
    layers: dict[str, list[int]]  # per kind, in the order asked
    weights: dict[str, npt.NDArray[np.float64]]


class ServingRunner(StepRunner, Protocol):
    """A step runner as the engine serves it (service/runner.py's :class:`~service.runner.Runner`, or a fake)."""

    @property
    def attention(self) -> bool: ...  # its graphs give attention weights (else such requests go to ``exact``)

    @property
    def provider(self) -> str: ...  # ONNX Runtime's execution provider


@dataclass(frozen=True)
class Runners:
    """A bundle's runners: ``exact``, the float32 graphs with attention outputs (/attention), and ``fast``, the
    graphs of the settings' ``graph_variant`` that /translate uses (``exact`` itself where no other is faster)."""

    exact: ServingRunner
    fast: ServingRunner

    @classmethod
    def build(cls, bundle: Bundle, settings: Settings) -> Runners:
        """The real ONNX Runtime runners for ``settings``: for float32 on the CPU the fast decoder (caches written
        in place, no attention outputs) sharing the exact runner's encoder, for int8 its quantized graphs, for
        float16 its exact graphs.

        Raises:
            BundleError: the bundle has no graphs of ``settings.graph_variant``.
        """
        provider, threads, variant = settings.provider, settings.threads, settings.graph_variant
        exact = Runner(bundle, provider, threads)
        if variant != "float32":
            return cls(exact, Runner(bundle, provider, threads, variant))
        if exact.provider == CPU:
            return cls(exact, Runner(bundle, provider, threads, fast=True, encoder=exact.encoder))
        return cls(exact, exact)  # the fast decoder's attention kernels (service/_attention.c) are the CPU's


def check_unicode(texts: Sequence[str]) -> None:
    """Refuse a text that is not valid Unicode before anything copies it through into an answer.

    Raises:
        InvalidText: an unpaired surrogate (field ``q``).
    """
    for text in texts:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise InvalidText(unencodable(text, "q"), "q") from e


def distinct(texts: list[str], n: int) -> list[str]:
    """Up to n of ``texts[1:]`` (hypotheses' texts, best first) that differ from ``texts[0]`` and from each other:
    hypotheses whose pieces differ can read the same, and an alternative that repeats a text tells nothing."""
    seen = {texts[0]}
    out: list[str] = []
    for text in texts[1:]:
        if len(out) == n:
            break
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def join_details(parts: list[Details]) -> Details | None:
    """One text's details from its segments': tokens concatenated, alignment indices into the joined source
    tokens; None for a text that decoded nothing (empty or whitespace)."""
    if not parts:
        return None
    source: list[str] = []
    alignment: list[int] = []
    for d in parts:
        alignment += [a + len(source) for a in d.alignment]
        source += d.source_tokens
    return Details(
        source_tokens=source,
        tokens=[t for d in parts for t in d.tokens],
        score=round(sum(d.score for d in parts), 6),
        token_scores=[x for d in parts for x in d.token_scores],
        alignment=alignment,
        coverage=[c for d in parts for c in d.coverage],
    )


def _ignore(_: int) -> None:
    pass


class Engine:
    """A loaded bundle with its runners; :meth:`start` adds the schedulers that the served methods use.

    /translate's texts go to the ``fast`` runner's schedulers, except those that need attention rows (``details``)
    when that runner has no attention outputs: they go to the ``exact`` runner's, as /attention's do. A runner has
    ``decode_threads`` schedulers (batching loops, each on its thread), which call its sessions concurrently; a
    request goes to the least busy one.
    """

    def __init__(self, bundle: Bundle, settings: Settings, runners: Runners) -> None:
        self.bundle = bundle
        self.settings = settings
        self.tokenizer = bundle.tokenizer
        self.runners = runners
        self.schedulers: dict[str, list[Scheduler]] = {}  # "exact", "fast": one per decoding thread
        # What requests in flight hold (service/budget.py); the heap goes back to the system once none is left.
        self.budget = Budget(settings.memory_budget_mb * MiB, on_idle=trim_memory)
        self._on_input: Callable[[int], object] = _ignore
        calibration = bundle.manifest.get("calibration")  # absent: no confidence, default flag thresholds
        self.calibration = Calibration.from_manifest(calibration, bundle.spec.n_decoder_layers, bundle.name)
        glossary = read_glossary(settings.glossary_dir, bundle.source_lang, bundle.target_lang)
        self.text = TextPipeline(self.tokenizer, bundle.source_lang, settings.sentence_split_chars, glossary)

    @classmethod
    def load(cls, path: Path, settings: Settings) -> Engine:
        """The bundle at ``path`` with its real runners.

        Raises:
            BundleError: the bundle is missing, corrupted or lacks the settings' graph variant.
        """
        bundle = load_bundle(path)
        return cls(bundle, settings, Runners.build(bundle, settings))

    @property
    def pair(self) -> tuple[str, str]:
        """(source language, target language)."""
        return self.bundle.source_lang, self.bundle.target_lang

    @property
    def provider(self) -> str:
        """The execution provider the exact graphs run on."""
        return self.runners.exact.provider

    async def start(
        self, on_step: Callable[[StepStats], None] | None = None, on_input: Callable[[int], object] = _ignore
    ) -> None:
        """Start the schedulers; ``on_step`` gets each step's stats (on a decoding thread), ``on_input`` each
        served request's source tokens once they are accepted."""
        s = self.settings
        self._on_input = on_input
        for name, runner in (("exact", self.runners.exact), ("fast", self.runners.fast)):
            if name == "fast" and runner is self.runners.exact:  # one runner, one set of schedulers
                self.schedulers["fast"] = self.schedulers["exact"]
                continue
            self.schedulers[name] = [
                Scheduler(
                    BatchDecoder(runner),
                    max_batch_size=s.max_batch_size,
                    max_batch_tokens=s.max_batch_tokens,
                    max_wait_ms=s.max_wait_ms,
                    queue_size=s.queue_size,
                    continuous=s.continuous_batching,
                    encode_ahead=s.encode_ahead,
                    small_share=s.small_request_share,
                    on_step=on_step,
                )
                for _ in range(s.decode_threads)
            ]
            for scheduler in self.schedulers[name]:
                await scheduler.start()

    async def stop(self) -> None:
        """Stop the schedulers; texts still queued or decoding fail with DeadlineExceeded."""
        for scheduler in self._unique_schedulers():
            await scheduler.stop()

    def _unique_schedulers(self) -> list[Scheduler]:
        return list({id(s): s for group in self.schedulers.values() for s in group}.values())

    @property
    def queue_depth(self) -> int:
        """Texts waiting in the schedulers' queues."""
        return sum(s.queue_depth for s in self._unique_schedulers())

    @property
    def active_sequences(self) -> int:
        """Rows being decoded."""
        return sum(s.active_sequences for s in self._unique_schedulers())

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]:
        """Translate texts together through the schedulers (:meth:`start` first).

        ``arrival`` (``time.monotonic()``, default now) is when the request came: its deadline,
        ``request_timeout_s``, counts from then.

        Raises:
            TooLarge: a text is over ``max_chars`` or ``max_tokens``; the texts are more than the queue holds, may
                generate more than the deadline allows (service/admission.py) or need more than the memory budget.
            QueueFull: the scheduler has no room for them all (BudgetFull: the memory budget stayed in use).
            DeadlineExceeded: ``request_timeout_s`` passed first.
            ClientGone: ``gone()`` said the caller went away; the texts' rows were freed.
        """
        self._check(texts)
        prepared = self.text.prepare(texts, options.glossary, options.keep)
        if prepared is None:
            requests = [self._request(t, options, options.details) for t in texts]
            out = self._translations(requests, await self._queued(requests, gone, arrival), options)
        else:
            requests = self._segment_requests(prepared, options)
            out = self._finished(prepared, requests, await self._queued(requests, gone, arrival), options)
        return self._assessed(texts, out) if options.details else out

    async def _queued(
        self, requests: list[DecodeRequest], gone: Gone | None, arrival: float | None
    ) -> list[DecodeResult]:
        """Requests through the schedulers, within the request's deadline and the memory budget."""
        if not requests:
            return []
        check_servable(requests, self.settings)
        deadline = (arrival or time.monotonic()) + self.settings.request_timeout_s
        spec = self.bundle.spec
        async with self.budget.hold(sum(request_bytes(r, spec) for r in requests), deadline):
            self._on_input(sum(len(r.src) for r in requests))
            return await self._wait(requests, False, gone, deadline)

    def translate_now(self, texts: Sequence[str], options: Options) -> list[Translation]:
        """:meth:`translate` without a scheduler (the command line), on the same graphs."""
        self._check(texts)
        prepared = self.text.prepare(texts, options.glossary, options.keep)
        if prepared is not None:
            requests = self._segment_requests(prepared, options)
            results = self._decode_now(requests, False) if requests else []
            out = self._finished(prepared, requests, results, options)
        else:
            requests = [self._request(t, options, options.details) for t in texts]
            out = self._translations(requests, self._decode_now(requests, False), options)
        return self._assessed(texts, out) if options.details else out

    def _assessed(self, texts: Sequence[str], translations: list[Translation]) -> list[Translation]:
        """Details with each text's confidence and flags (service/confidence.py)."""
        out = []
        for text, t in zip(texts, translations, strict=True):
            if (d := t.details) is not None:
                content = [is_content(p) for p in d.source_tokens]
                a = self.calibration.assess(Evidence(d.token_scores, d.coverage, content, text, t.text))
                t = replace(t, details=replace(d, confidence=a.confidence, flags=a.flags))
            out.append(t)
        return out

    def _check(self, texts: Sequence[str]) -> None:
        """The texts as the caller sent them: valid Unicode and within ``max_chars`` (a segment, masked, may be
        longer than its text).

        Raises:
            InvalidText: an unpaired surrogate.
            TooLarge: a text over ``max_chars``.
        """
        check_unicode(texts)
        limit = self.settings.max_chars
        if (longest := max((len(t) for t in texts), default=0)) > limit:
            raise TooLarge(f"a text has {longest} characters; the limit is max_chars={limit}", "max_chars", limit)

    def _segment_requests(self, prepared: Prepared, options: Options) -> list[DecodeRequest]:
        """One request a segment; those with spans collect attention, which places them."""
        return [self._request(s.source, options, options.details or s.masked is not None) for s in prepared.segments]

    def _finished(
        self, prepared: Prepared, requests: list[DecodeRequest], results: list[DecodeResult], options: Options
    ) -> list[Translation]:
        """Texts put back together from their segments; details join the segments' (alignment into the joined
        source tokens)."""
        outputs = []
        for segment, request, result in zip(prepared.segments, requests, results, strict=True):
            outputs.append([self.text.restored(segment, request.src, h) for h in result.hypotheses])
        out = []
        for (best, versions), parts in zip(
            prepared.finish(outputs, options.alternatives), prepared.ranges(), strict=True
        ):
            details = None
            if options.details:
                details = join_details([self._details(requests[i], results[i].hypotheses[0]) for i in parts])
            out.append(Translation(best, distinct(versions, options.alternatives), details))
        return out

    async def attention(
        self,
        text: str,
        options: Options,
        filters: Filters,
        target_text: str | None = None,
        gone: Gone | None = None,
        arrival: float | None = None,
    ) -> AttentionResult:
        """Translate (or force-decode ``target_text``) one text on the exact graphs, with its attention weights.

        Raises:
            NoSuchIndex: a layer or head in ``filters`` that the model does not have.
            TooLarge: the text or the target text is over a limit, or its weights over the memory budget.
            QueueFull, DeadlineExceeded, ClientGone: as :meth:`translate`.
        """
        request = self._attention_request(text, options, filters, target_text)
        check_servable([request], self.settings)
        deadline = (arrival or time.monotonic()) + self.settings.request_timeout_s
        size = request_bytes(request, self.bundle.spec) + answer_bytes(self.bundle.spec, request, filters)
        async with self.budget.hold(size, deadline):
            self._on_input(len(request.src))
            (result,) = await self._wait([request], True, gone, deadline)
            return self._attention_result(request, result, filters)

    def attention_now(
        self, text: str, options: Options, filters: Filters, target_text: str | None = None
    ) -> AttentionResult:
        """:meth:`attention` without a scheduler (the command line)."""
        request = self._attention_request(text, options, filters, target_text)
        (result,) = self._decode_now([request], True)
        return self._attention_result(request, result, filters)

    def warm_up(self) -> None:
        """Decode one short text so that the first real request does not pay for ONNX Runtime's lazy set-up."""
        self._decode_now([self._request("Hello.", Options(max_length=4), False)], False)

    def _request(self, text: str, options: Options, attention: bool, target_text: str | None = None) -> DecodeRequest:
        """Tokenize one text (checked by :meth:`_check`, or a segment of such a text) against the token limit.

        Raises:
            TooLarge: the text is over ``max_tokens``, or the target text over its limits.
        """
        s = self.settings
        src = self.tokenizer.encode_source(text)
        limit = min(s.max_tokens, self.bundle.spec.max_positions)
        if len(src) > limit:
            raise TooLarge(f"a text has {len(src)} tokens; the limit is max_tokens={limit}", "max_tokens", limit)
        forced = None if target_text is None else self._forced(target_text)
        max_length = options.max_length or min(s.max_length, 2 * len(src) + 10)
        max_length = min(max_length, self.bundle.spec.max_positions)
        beam = options.beam
        return DecodeRequest(
            src=src,
            beam_size=beam,
            max_length=max_length,
            length_penalty=options.length_penalty,
            n_best=beam if options.alternatives else 1,  # every hypothesis the beam finishes: distinct() picks
            forced=forced,
            attention=attention,
            scores=attention,  # details, the one answer that reports scores, also asks for attention
        )

    def _forced(self, target_text: str) -> list[int]:
        s = self.settings
        if len(target_text) > s.max_chars:
            raise TooLarge(
                f"target_text has {len(target_text)} characters; the limit is {s.max_chars}", "max_chars", s.max_chars
            )
        forced = self.tokenizer.encode_target(target_text)
        if len(forced) > min(s.max_length, self.bundle.spec.max_positions):
            raise TooLarge(
                f"target_text has {len(forced)} tokens; the limit is max_length={s.max_length}",
                "max_length",
                s.max_length,
            )
        return forced

    def _exact(self, requests: list[DecodeRequest], exact: bool) -> bool:
        return exact or (not self.runners.fast.attention and any(r.attention for r in requests))

    async def _wait(
        self, requests: list[DecodeRequest], exact: bool, gone: Gone | None, deadline: float
    ) -> list[DecodeResult]:
        """Queue texts together on the least busy scheduler and wait for them until ``deadline``, giving up (and
        freeing their rows) if the caller goes away. It looks after 1 s, as nearly every answer comes first, then
        every 2 s: each look costs the event loop, which the decoding thread then waits for (the GIL). No task of
        its own either. The deadline is kept here too: a decoding step in progress does not delay the answer."""
        assert self.schedulers, "Engine.start() was not called"
        group = self.schedulers["exact" if self._exact(requests, exact) else "fast"]
        scheduler = group[0] if len(group) == 1 else min(group, key=lambda s: s.queue_depth + s.active_sequences)
        timeout = self.settings.request_timeout_s
        futures = scheduler.submit_many(requests, timeout, deadline - timeout)
        try:
            wait = 1.0
            while True:
                if (left := deadline - time.monotonic()) <= 0:
                    raise DeadlineExceeded(f"the deadline passed after {timeout:g} s")
                done, pending = await asyncio.wait(
                    futures, timeout=min(wait, left), return_when=asyncio.FIRST_EXCEPTION
                )
                for f in done:
                    if (failure := f.exception()) is not None:
                        raise failure
                if not pending:
                    return [f.result() for f in futures]
                if gone is not None and await gone():
                    raise ClientGone()
                wait = min(2 * wait, 2.0)
        finally:
            for f in futures:
                f.cancel()  # nothing for a finished one; an unfinished one's rows are freed

    def _decode_now(self, requests: list[DecodeRequest], exact: bool) -> list[DecodeResult]:
        runners = self.runners
        return decode(runners.exact if self._exact(requests, exact) else runners.fast, requests)

    def _translations(
        self, requests: list[DecodeRequest], results: list[DecodeResult], options: Options
    ) -> list[Translation]:
        out = []
        for request, result in zip(requests, results, strict=True):
            texts = [self.tokenizer.decode(h.tokens) for h in result.hypotheses]
            details = self._details(request, result.hypotheses[0]) if options.details else None
            out.append(Translation(texts[0], distinct(texts, options.alternatives), details))
        return out

    def _details(self, request: DecodeRequest, hyp: Hypothesis) -> Details:
        cross = np.stack(hyp.cross_attention)  # (T, L, h, S)
        alignment = cross[:, -1].mean(axis=1).argmax(axis=-1)
        return Details(
            source_tokens=self.tokenizer.pieces(request.src),
            tokens=self.tokenizer.pieces(hyp.tokens),
            score=round(hyp.score, 6),
            token_scores=[round(x, 6) for x in hyp.token_scores],
            alignment=[int(a) for a in alignment],
            coverage=[round(float(c), 6) for c in coverage(cross, self.calibration.layers)],
        )

    def _attention_request(
        self, text: str, options: Options, filters: Filters, target_text: str | None
    ) -> DecodeRequest:
        """Raises NoSuchIndex for a layer or head that does not exist in the requested kinds, else as _request."""
        spec = self.bundle.spec
        for kind in filters.kinds:
            n = spec.n_encoder_layers if kind == "encoder" else spec.n_decoder_layers
            bad = [i for i in filters.layers or [] if not 0 <= i < n]
            if bad:
                raise NoSuchIndex(f"layers {bad} do not exist for {kind} attention: it has layers 0..{n - 1}")
        bad = [i for i in filters.heads or [] if not 0 <= i < spec.h]
        if bad:
            raise NoSuchIndex(f"heads {bad} do not exist: the model has heads 0..{spec.h - 1}")
        self._check([text])
        return self._request(text, options, True, target_text)

    def _attention_result(self, request: DecodeRequest, result: DecodeResult, filters: Filters) -> AttentionResult:
        hyp = result.hypotheses[0]
        spec = self.bundle.spec
        T = len(hyp.tokens)
        self_att = np.zeros((spec.n_decoder_layers, spec.h, T, T), np.float32)
        for t, row in enumerate(hyp.self_attention):  # row (L, h, t + 1): no position attends to a later one
            self_att[:, :, t, : t + 1] = row
        arrays = {
            "encoder": result.encoder_attention,  # (L_enc, h, S, S)
            "decoder": self_att,
            "cross": np.stack(hyp.cross_attention, axis=2),  # (L_dec, h, T, S)
        }
        heads = list(range(spec.h)) if filters.heads is None else filters.heads
        layers: dict[str, list[int]] = {}
        weights: dict[str, npt.NDArray[np.float64]] = {}
        for kind in dict.fromkeys(filters.kinds):
            a = arrays[kind]
            assert a is not None
            layers[kind] = list(range(a.shape[0])) if filters.layers is None else filters.layers
            weights[kind] = a[layers[kind]][:, heads].astype(np.float64).round(6)
        start = self.tokenizer.pieces([spec.decoder_start_id])
        return AttentionResult(
            source_tokens=self.tokenizer.pieces(request.src),
            target_tokens=self.tokenizer.pieces(hyp.tokens),
            decoder_input_tokens=start + self.tokenizer.pieces(hyp.tokens[:-1]),
            text=self.tokenizer.decode(hyp.tokens),
            heads=heads,
            layers=layers,
            weights=weights,
        )
