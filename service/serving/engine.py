"""One language pair: a bundle's tokenizer, its runners and their schedulers (a bundle of several targets gives one
engine a target, sharing them: :meth:`Engine.for_target`). Texts and options in, translations
and attention weights out; the HTTP API and the command line share it, so both give the same answers.

It speaks the domain only: it raises service.errors and returns the dataclasses below, which service/http shapes
into JSON.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np

from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, Hypothesis, StepRunner, decode
from service.decoding.constraint import Spelling
from service.errors import ClientGone, NoSuchIndex, TooLarge, UnknownPair
from service.runtime.bundle import Bundle, load_bundle
from service.runtime.providers import CPU, choose_provider
from service.runtime.runner import AppendedRunner, open_runner, trim_memory
from service.serving.admission import check_servable
from service.serving.alignment import SegmentInput, alignable
from service.serving.budget import Budget, MiB, answer_bytes, request_bytes
from service.serving.cache import LruCache, through_cache
from service.serving.catalog import pair_label
from service.serving.confidence import Calibration, Evidence, coverage, is_content
from service.serving.constrained_first import ConstrainedFirst
from service.serving.core_sharing import WhileSaturated
from service.serving.explain import explaining
from service.serving.on_first_use import OnFirstUse
from service.serving.restoring import ForcingRunner, Restored, attend, restore_spans, worst
from service.serving.scheduler import DeadlineExceeded, Scheduler, StepStats
from service.serving.steps import Step, carried, carried_now, together
from service.serving.translation import (
    AttentionResult,
    Details,
    Filters,
    Gone,
    Options,
    Translation,
    cache_key,
    check_unicode,
    distinct,
    join_details,
    translation_strings,
)
from service.serving.unlooping import Guard, unlooped
from service.settings import Settings
from service.text.forced import forced_targets
from service.text.glossary import read_glossary
from service.text.pipeline import Prepared, TextPipeline
from service.text.repetition import has_loop

log = logging.getLogger(__name__)


class ServingRunner(StepRunner, Protocol):
    """A step runner as the engine serves it (one of service/runtime/runner.py's forms, or a fake)."""

    @property
    def attention(self) -> bool: ...  # its graphs give attention weights (else such requests go to ``exact``)

    @property
    def provider(self) -> str: ...  # ONNX Runtime's execution provider


@dataclass(frozen=True)
class Runners:
    """A bundle's runners: ``exact``, the float32 graphs with attention outputs (/attention), and ``fast``, the
    graphs of the variant /translate serves (:meth:`~service.runtime.bundle.Bundle.served_variant`; ``exact`` itself
    where no other is faster); ``forced``, the exact runner where the bundle has a forced decoder."""

    exact: ServingRunner
    fast: ServingRunner
    forced: ForcingRunner | None = None

    @classmethod
    def build(cls, bundle: Bundle, settings: Settings) -> Runners:
        """The real ONNX Runtime runners for ``settings``. On the CPU: for float32 the fast decoder (caches written
        in place, no attention outputs) with the exact encoder, for int8 its quantized graphs, for float16 its exact
        graphs; the exact runner's other sessions open on first need (service/serving/on_first_use.py), sharing the
        float32 encoder's. On CUDA, every session now: the variant's device decoder where the bundle has one (token
        choice and cache reordering on the device, sharing float32's exact encoder), else the exact graphs (the fast
        decoder's attention kernels, service/runtime/_attention.c, are the CPU's).

        Raises:
            BundleError: the bundle has no graphs of the variant it serves.
        """
        provider, threads, variant = settings.provider, settings.threads, bundle.served_variant(settings.graph_variant)
        if choose_provider(provider) == CPU:
            if variant == "float32":
                fast = open_runner(bundle, provider, threads, role="fast_decoder")
                exact = OnFirstUse(partial(AppendedRunner, bundle, provider, threads, encoder=fast.encoder), bundle)
            else:
                fast = open_runner(bundle, provider, threads, variant)
                exact = OnFirstUse(partial(AppendedRunner, bundle, provider, threads), bundle)
            return cls(exact, fast, exact if exact.has_forced else None)
        limit = settings.gpu_mem_limit_mb
        on_device = AppendedRunner(bundle, provider, threads, gpu_mem_limit_mb=limit)
        forced = on_device if on_device.has_forced else None
        if bundle.has_graph("device_decoder", variant):
            encoder = on_device.encoder if variant == "float32" else None
            device = open_runner(bundle, provider, threads, variant, "device_decoder", encoder=encoder)
            return cls(on_device, device, forced)
        if variant != "float32":
            return cls(on_device, open_runner(bundle, provider, threads, variant, gpu_mem_limit_mb=limit), forced)
        return cls(on_device, on_device, forced)


@dataclass(frozen=True)
class Pooled:
    """What every engine of a process shares: the memory that requests in flight may hold (``memory_budget_mb``)
    and the response cache (``cache_mb``; None: off)."""

    budget: Budget
    cache: LruCache[Translation] | None

    @classmethod
    def of(cls, settings: Settings) -> Pooled:
        """A budget and a cache of the settings' sizes. The heap's free memory goes back to the system when the
        budget is unused, and every memory_trim_interval_s under load."""
        budget = Budget(settings.memory_budget_mb * MiB, trim=trim_memory, trim_every_s=settings.memory_trim_interval_s)
        return cls(budget, LruCache[Translation](settings.cache_mb * MiB) if settings.cache_mb else None)


def _ignore(*_: int) -> None:
    pass


def _ignore_paths(_: list[str]) -> None:
    pass


class Engine:
    """A loaded bundle with its runners; :meth:`start` adds the schedulers that the served methods use.

    /translate's texts go to the ``fast`` runner's schedulers, except those that need attention rows (``details``)
    when that runner has no attention outputs: they go to the ``exact`` runner's, as /attention's do. A runner has
    ``decode_threads`` schedulers (batching loops, each on its thread), which call its sessions concurrently; a
    request goes to the least busy one.
    """

    def __init__(
        self,
        bundle: Bundle,
        settings: Settings,
        runners: Runners,
        target: str | None = None,
        pooled: Pooled | None = None,
    ) -> None:
        """Args:
            target: which of the bundle's targets this engine translates into (default its first).
            pooled: the process's memory budget and response cache, shared with its other engines (default its
                own, of the settings' sizes).

        Raises:
            UnknownPair: the bundle has no such target.
            BundleError: a malformed calibration.
        """
        self.bundle = bundle
        self.settings = settings
        self.tokenizer = bundle.tokenizer
        self.runners = runners
        self.schedulers: dict[str, list[Scheduler]] = {}  # "exact", "fast": one per decoding thread
        pooled = pooled or Pooled.of(settings)
        self.budget = pooled.budget  # what requests in flight hold (service/serving/budget.py)
        # Translations of texts already translated with the same options (service/serving/cache.py), under this
        # engine's own key: a bundle loaded again, or another bundle for the pair, never answers with its entries.
        self.cache = pooled.cache
        self._entries = object()
        self._on_input: Callable[[int], object] = _ignore
        self._on_cache: Callable[[int, int], object] = _ignore
        self._on_spans: Callable[[list[str]], object] = _ignore_paths
        calibration = bundle.manifest.calibration  # absent: no confidence, default flag thresholds
        self.calibration = Calibration.from_manifest(calibration, bundle.spec.n_decoder_layers, bundle.name)
        spec = bundle.spec  # the target vocabulary as a constrained re-decode reads it (service/decoding/constraint.py)
        self.spelling = Spelling(self.tokenizer.pieces(list(range(spec.vocab_size))), spec.eos_id)
        self.constrained_first = ConstrainedFirst()
        self._aim(target or next(iter(bundle.targets)))

    def _aim(self, target: str) -> None:
        """Translate into ``target``: its source prefix (a multi-target model's ``>>xxx<<`` id) and its glossary.

        Raises:
            UnknownPair: the bundle has no such target.
        """
        bundle, settings = self.bundle, self.settings
        if target not in bundle.targets:
            have = ", ".join(bundle.targets)
            raise UnknownPair(f"{bundle.name} translates {bundle.source_lang} into {have}, not {target}")
        self.target = target
        self.decoding = settings.decoding((bundle.source_lang, target))  # a request's beam and penalty by default
        self.prefix = bundle.targets[target]  # ids that open every source, as the model was trained
        glossary = read_glossary(settings.glossary_dir, bundle.source_lang, target)
        self.text = TextPipeline(
            self.tokenizer, bundle.source_lang, settings.sentence_split_chars, glossary, spelling=self.spelling
        )

    def for_target(self, target: str) -> Engine:
        """An engine for another of the bundle's targets that shares this one's runners and schedulers (call it
        after :meth:`start`; only this engine is started and stopped).

        Raises:
            UnknownPair: the bundle has no such target.
        """
        other = copy.copy(self)
        other._aim(target)
        return other

    def for_targets(self) -> list[Engine]:
        """This engine and one :meth:`for_target` engine for each other target of the bundle."""
        return [self, *(self.for_target(t) for t in self.bundle.targets if t != self.target)]

    @classmethod
    def load(cls, path: Path, settings: Settings, target: str | None = None) -> Engine:
        """The bundle at ``path`` with its real runners, translating into ``target`` (default its first).

        Raises:
            BundleError: the bundle is missing, corrupted or lacks the graph variant it serves.
            UnknownPair: the bundle has no such target.
        """
        bundle = load_bundle(path)
        return cls(bundle, settings, Runners.build(bundle, settings), target)

    @property
    def pair(self) -> tuple[str, str]:
        """(source language, target language)."""
        return self.bundle.source_lang, self.target

    @property
    def label(self) -> str:
        """The pair as metrics label it (``en-de``)."""
        return pair_label(self.pair)

    @property
    def provider(self) -> str:
        """The execution provider the exact graphs run on."""
        return self.runners.exact.provider

    @property
    def variant(self) -> str:
        """The graph variant /translate serves (the setting, else the bundle's default)."""
        return self.bundle.served_variant(self.settings.graph_variant)

    async def start(
        self,
        on_step: Callable[[StepStats], None] | None = None,
        on_input: Callable[[int], object] = _ignore,
        on_cache: Callable[[int, int], object] = _ignore,
        saturation: WhileSaturated | None = None,
        on_spans: Callable[[list[str]], object] = _ignore_paths,
    ) -> None:
        """Start the schedulers; ``on_step`` gets each step's stats (on a decoding thread), ``on_input`` each
        served request's source tokens once they are accepted, ``on_cache`` each cached request's texts found in
        the cache and not, ``saturation`` (the process's one, shared by every engine) the rows each batch holds
        after a step, ``on_spans`` the path that restored each decoded segment with spans
        (service/serving/restoring.py's ``PATHS``)."""
        s = self.settings
        self._on_input, self._on_cache, self._on_spans = on_input, on_cache, on_spans
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
                    saturation=saturation,
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

    def queued_by_pair(self) -> Counter[str]:
        """Texts waiting in the schedulers' queues, by pair label (a multi-target bundle's pairs share the
        schedulers)."""
        return sum((s.queued_by_pair() for s in self._unique_schedulers()), Counter())

    def rows_by_pair(self) -> Counter[str]:
        """Rows being decoded, by pair label."""
        return sum((s.rows_by_pair() for s in self._unique_schedulers()), Counter())

    async def translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None = None, arrival: float | None = None
    ) -> list[Translation]:
        """Translate texts together through the schedulers (:meth:`start` first).

        ``arrival`` (``time.monotonic()``, default now) is when the request came: its deadline,
        ``request_timeout_s``, counts from then.

        Raises:
            TooLarge: a text is over ``max_chars`` or ``max_tokens``; the texts are more than the queue holds, may
                generate more than the deadline allows (service/serving/admission.py) or need more than the memory
                budget.
            QueueFull: the scheduler has no room for them all (BudgetFull: the memory budget stayed in use).
            DeadlineExceeded: ``request_timeout_s`` passed first.
            ClientGone: ``gone()`` said the caller went away; the texts' rows were freed.
        """
        if self.cache is not None and not options.details and not options.alignments:
            return await self._cached(texts, options, gone, arrival)
        return await self._translate(texts, options, gone, arrival)

    async def _cached(
        self, texts: Sequence[str], options: Options, gone: Gone | None, arrival: float | None
    ) -> list[Translation]:
        """The texts the cache holds from it, the others through :meth:`_translate` (and into the cache)."""
        assert self.cache is not None

        def translate(missing: list[str]) -> Awaitable[list[Translation]]:
            return self._translate(missing, options, gone, arrival)

        key = (self._entries, self.target, cache_key(options.defaulted(*self.decoding)))
        out, missing = await through_cache(self.cache, texts, key, translate, translation_strings)
        self._on_cache(len(texts) - missing, missing)
        return out

    async def _translate(
        self, texts: Sequence[str], options: Options, gone: Gone | None, arrival: float | None
    ) -> list[Translation]:
        """:meth:`translate` without the cache: :meth:`_steps` through the schedulers."""

        def queued(requests: list[DecodeRequest]) -> Awaitable[list[DecodeResult]]:
            return self._queued(requests, gone, arrival)

        return await carried(self._steps(texts, options), queued)

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
            return await self._sent(requests, False, gone, deadline)

    async def _sent(
        self, requests: list[DecodeRequest], exact: bool, gone: Gone | None, deadline: float
    ) -> list[DecodeResult]:
        """Requests (checked and held for) through the schedulers, their source tokens counted."""
        self._on_input(sum(len(r.src) for r in requests))
        return await self._wait(requests, exact, gone, deadline)

    def translate_now(self, texts: Sequence[str], options: Options) -> list[Translation]:
        """:meth:`translate` without a scheduler (the command line), on the same graphs: :meth:`_steps` in turn."""
        return carried_now(self._steps(texts, options), partial(self._decode_now, exact=False))

    def _steps(self, texts: Sequence[str], options: Options) -> Generator[Step, list[DecodeResult], list[Translation]]:
        """A translation's work, for :meth:`_translate` and :meth:`translate_now` to carry out: it yields requests
        to decode (and is sent their results) or a function to call off the event loop (and is sent ``[]``), and
        returns the translations."""
        self._check(texts)
        prepared = None if options.raw else self.text.prepare(texts, options.glossary, options.keep)
        if prepared is None:  # every text decodes as it is
            requests = [self._request(t, options, self._attention_rows(options)) for t in texts]
            results = yield requests
            if (guard := self._guard(options)) is not None:
                yield from unlooped(guard, self.tokenizer.decode, list(texts), requests, results)
            if options.alignments:
                yield from self._attend_best(requests, results)
            out = self._translations(requests, results, options)
            if options.alignments:
                out = self._aligned(texts, out, self._plain_inputs(texts, out, results))
            return self._assessed(texts, out) if options.details else out
        requests = self._segment_requests(prepared, options)
        first = [r.constraint is not None for r in requests]
        results = yield requests
        if (guard := self._guard(options)) is not None:
            sources = [s.source for s in prepared.segments]
            yield from unlooped(guard, self.tokenizer.decode, sources, requests, results)
        restored = yield from restore_spans(self.text, self.runners.forced, prepared, requests, results)
        for constrained, path in zip(first, restored.paths, strict=True):
            if path is not None and not (constrained and path == "constrained"):  # an unconstrained first decode
                self.constrained_first.record(path != "decoded")
        self._on_spans([p for p in restored.paths if p is not None])
        out = self._finished(prepared, requests, results, restored, options)
        if options.alignments:
            yield from self._attend_best(requests, results)
            out = self._aligned(texts, out, self._segment_inputs(prepared, results, restored))
        return self._assessed(texts, out) if options.details else out

    def _guard(self, options: Options) -> Guard | None:
        """The request's repetition guard where the settings keep it on (service/serving/unlooping.py); a raw text
        gets the model's output as it is."""
        return options.guard if self.settings.repetition_guard and not options.raw else None

    def _attention_rows(self, options: Options) -> bool:
        """Whether decoding collects attention rows: for details, and for alignments where no forced decoder can
        give the answering hypotheses' cross-attention after decoding."""
        return options.details or (options.alignments and self.runners.forced is None)

    def _segment_requests(self, prepared: Prepared, options: Options) -> list[DecodeRequest]:
        """One request a segment, on the fast graphs unless it needs attention rows (:meth:`_attention_rows`); a
        segment with spans constrained from the start where the pair's model breaks its stand-ins
        (service/serving/constrained_first.py)."""
        requests = []
        for s in prepared.segments:
            request = self._request(s.source, options, self._attention_rows(options))
            if s.masked is not None and self.constrained_first.now():
                request = replace(request, constraint=self.text.constraint(s))
            requests.append(request)
        return requests

    def _attend_best(
        self, requests: list[DecodeRequest], results: list[DecodeResult]
    ) -> Generator[Step, list[DecodeResult], None]:
        """The best hypotheses' cross-attention, from one forced-decoder call where decoding did not collect it."""
        everyone = list(range(len(requests)))
        yield from attend(
            self.runners.forced, requests, results, everyone, lambda i, h: h is results[i].hypotheses[0]
            and not h.cross_attention
        )  # fmt: skip

    def _plain_inputs(
        self, texts: Sequence[str], translations: list[Translation], results: list[DecodeResult]
    ) -> list[list[SegmentInput]]:
        """Per text decoded whole, its one segment."""
        return [
            [self._segment_input((0, len(text)), (0, len(t.text)), text, r)]
            for text, t, r in zip(texts, translations, results, strict=True)
        ]

    def _segment_inputs(
        self, prepared: Prepared, results: list[DecodeResult], restored: Restored
    ) -> list[list[SegmentInput]]:
        """Per text, its segments: where each stands in the text and in its translation, and what answered it."""
        places = prepared.placed([texts[0] for texts in restored.texts])
        return [
            [
                self._segment_input(prepared.offsets[i], place, prepared.segments[i].source, results[i])
                for i, place in zip(parts, text_places, strict=True)
            ]
            for parts, text_places in zip(prepared.ranges(), places, strict=True)
        ]

    def _segment_input(
        self, source: tuple[int, int], target: tuple[int, int], model_input: str, result: DecodeResult
    ) -> SegmentInput:
        hyp, spec = result.hypotheses[0], self.bundle.spec
        cross = (
            np.stack(hyp.cross_attention) if hyp.cross_attention else np.zeros((0, spec.n_decoder_layers, spec.h, 0))
        )
        return SegmentInput(source, target, model_input, self.tokenizer.pieces(hyp.tokens), cross)

    def _aligned(
        self, texts: Sequence[str], translations: list[Translation], inputs: list[list[SegmentInput]]
    ) -> list[Translation]:
        """The translations with what their word alignments are read from."""
        spec = self.bundle.spec
        return [
            replace(
                t,
                alignable=alignable(self.tokenizer, self.pair, text, t.text, segments, (spec.n_decoder_layers, spec.h)),
            )
            for text, t, segments in zip(texts, translations, inputs, strict=True)
        ]

    def _assessed(self, texts: Sequence[str], translations: list[Translation]) -> list[Translation]:
        """Details with each text's confidence and flags (service/serving/confidence.py)."""
        out = []
        for text, t in zip(texts, translations, strict=True):
            if (d := t.details) is not None:
                content = [is_content(p) for p in d.source_tokens]
                a = self.calibration.assess(Evidence(d.token_scores, d.coverage, content, text, t.text))
                flags = [*a.flags, "repetition"] if has_loop(text, t.text) else a.flags
                t = replace(t, details=replace(d, confidence=a.confidence, flags=flags))
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

    def _finished(
        self,
        prepared: Prepared,
        requests: list[DecodeRequest],
        results: list[DecodeResult],
        restored: Restored,
        options: Options,
    ) -> list[Translation]:
        """Texts put back together from their segments' restored texts; details join the segments' (alignment into
        the joined source tokens) and name the latest path that restored a segment's spans."""
        out = []
        for (best, versions), parts in zip(
            prepared.finish(restored.texts, options.alternatives), prepared.ranges(), strict=True
        ):
            details = None
            if options.details:
                details = join_details([self._details(requests[i], results[i].hypotheses[0]) for i in parts])
                if details is not None:
                    details = replace(details, spans=worst([restored.paths[i] for i in parts]))
            out.append(Translation(best, distinct(versions, options.alternatives), details))
        return out

    async def attention(
        self,
        texts: Sequence[str],
        options: Options,
        filters: Filters,
        target_texts: Sequence[str | None] | None = None,
        gone: Gone | None = None,
        arrival: float | None = None,
    ) -> list[AttentionResult]:
        """Translate (or force-decode each text's ``target_texts`` entry, None: search) texts on the exact graphs,
        with their attention weights: each text is cut into segments and its spans masked as :meth:`translate` does,
        so it gets the same translation. The texts' segments decode together; each text's answer is the one it gets
        alone.

        Raises:
            NoSuchIndex: a layer or head in ``filters`` that the model does not have.
            TooLarge: a text or a target text is over a limit, or the weights over the memory budget.
            LayoutMismatch: a target text is not laid out as its text (service/text/forced.py).
            QueueFull, DeadlineExceeded, ClientGone: as :meth:`translate`.
        """
        steps, requests, size = self._explaining(texts, options, filters, target_texts)
        check_servable(requests, self.settings)  # a constrained re-decode redoes some of these, within their bounds
        deadline = (arrival or time.monotonic()) + self.settings.request_timeout_s

        def sent(step: list[DecodeRequest]) -> Awaitable[list[DecodeResult]]:
            return self._sent(step, True, gone, deadline)

        async with self.budget.hold(size, deadline):
            return await carried(steps, sent)

    def attention_now(
        self,
        texts: Sequence[str],
        options: Options,
        filters: Filters,
        target_texts: Sequence[str | None] | None = None,
    ) -> list[AttentionResult]:
        """:meth:`attention` without a scheduler (the command line): the texts' segments decode together."""
        steps, _, _ = self._explaining(texts, options, filters, target_texts)
        return carried_now(steps, partial(self._decode_now, exact=True))

    def _explaining(
        self,
        texts: Sequence[str],
        options: Options,
        filters: Filters,
        target_texts: Sequence[str | None] | None,
    ) -> tuple[Generator[Step, list[DecodeResult], list[AttentionResult]], list[DecodeRequest], int]:
        """The texts' /attention work as one step generator (service/serving/steps.py's ``together``), every
        request of their first decode, and the bytes they hold (:meth:`_attention_bytes`)."""
        spec, forced = self.bundle.spec, self.runners.forced
        answers, everything, size = [], [], 0
        for text, target in zip(texts, target_texts or [None] * len(texts), strict=True):
            prepared, requests = self._attention_requests(text, options, filters, target)
            recover = target is None
            align = (text, self.pair) if options.alignments else None
            answers.append(explaining(self.text, forced, spec, prepared, requests, filters, recover, align))
            everything += requests
            size += self._attention_bytes(prepared, requests, filters, recover)
        return together(answers), everything, size

    def _attention_bytes(
        self, prepared: Prepared, requests: list[DecodeRequest], filters: Filters, recover: bool
    ) -> int:
        """What /attention holds until its answer is built: each segment's decode and answer, and for each segment
        with spans the constrained re-decode it may need (held from the start: a hold taken while holding could
        wait behind requests that wait for this one)."""
        spec = self.bundle.spec
        size = sum(request_bytes(r, spec) + answer_bytes(spec, r, filters) for r in requests)
        if recover:
            segments = zip(prepared.segments, requests, strict=True)
            size += sum(request_bytes(r, spec) for s, r in segments if s.masked is not None)
        return size

    def warm_up(self) -> None:
        """Decode one short text so that the first real request does not pay for ONNX Runtime's lazy set-up."""
        self._decode_now([self._request("Hello.", Options(max_length=4), False)], False)

    def _request(self, text: str, options: Options, attention: bool, target_text: str | None = None) -> DecodeRequest:
        """Tokenize one text (checked by :meth:`_check`, or a segment of such a text) against the token limit.

        Raises:
            TooLarge: the text is over ``max_tokens``, or the target text over its limits.
        """
        s = self.settings
        src = [*self.prefix, *self.tokenizer.encode_source(text)]
        limit = min(s.max_tokens, self.bundle.spec.max_positions)
        if len(src) > limit:
            raise TooLarge(f"a text has {len(src)} tokens; the limit is max_tokens={limit}", "max_tokens", limit)
        forced = None if target_text is None else self._forced(target_text)
        prefix = self.tokenizer.target_prefix  # forced, and not counted in the length asked for
        max_length = options.max_length or min(s.max_length, 2 * len(src) + 10)
        max_length = min(max_length + len(prefix), self.bundle.spec.max_positions)
        beam_size, length_penalty = self.decoding
        beam_size = beam_size if options.beam_size is None else options.beam_size
        beam = max(beam_size, options.alternatives + 1)  # widened to give the alternatives
        return DecodeRequest(
            src=src,
            beam_size=beam,
            max_length=max_length,
            length_penalty=length_penalty if options.length_penalty is None else options.length_penalty,
            n_best=beam if options.alternatives else 1,  # every hypothesis the beam finishes: distinct() picks
            forced=forced,
            attention=attention,
            scores=attention,  # details, the one answer that reports scores, also asks for attention
            prefix=prefix,
        )

    def _check_target(self, target_text: str) -> None:
        """Raises TooLarge for a ``target_text`` over ``max_chars``."""
        s = self.settings
        if len(target_text) > s.max_chars:
            raise TooLarge(
                f"target_text has {len(target_text)} characters; the limit is {s.max_chars}", "max_chars", s.max_chars
            )

    def _forced(self, target_text: str) -> list[int]:
        """One segment's forced target ids (its part of a ``target_text`` that :meth:`_check_target` passed).

        Raises:
            TooLarge: over ``max_length`` tokens.
            InvalidText: not valid Unicode.
        """
        s = self.settings
        forced = self.tokenizer.encode_target(target_text)
        if len(forced) > min(s.max_length, self.bundle.spec.max_positions):
            raise TooLarge(
                f"target_text has {len(forced)} tokens in one line or sentence; the limit is max_length={s.max_length}",
                "max_length",
                s.max_length,
            )
        return forced

    def _exact(self, requests: list[DecodeRequest], exact: bool) -> bool:
        """Whether ``requests`` go to the exact runner: asked, or the fast one cannot serve them (attention rows from
        a graph without them; forced or constrained rows, which read every logit, from a device decoder's
        candidates)."""
        fast = self.runners.fast
        return (
            exact
            or (not fast.attention and any(r.attention for r in requests))
            or (fast.form.candidates and any(r.forced is not None or r.adjusted for r in requests))
        )

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
        futures = scheduler.submit_many(requests, timeout, deadline - timeout, self.label)
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

    def _attention_requests(
        self, text: str, options: Options, filters: Filters, target_text: str | None
    ) -> tuple[Prepared, list[DecodeRequest]]:
        """The text's segments, as :meth:`translate` cuts and masks them, and one request a segment with attention
        rows (forced to its part of ``target_text``).

        Raises:
            NoSuchIndex: a layer or head that does not exist in the requested kinds.
            LayoutMismatch: ``target_text`` is not laid out as the text.
            TooLarge, InvalidText: as :meth:`_request`.
        """
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
        prepared = self.text.segmented(text, options.glossary, options.keep, options.raw)
        targets: list[str | None] = [None] * len(prepared.segments)
        if target_text is not None:
            self._check_target(target_text)
            targets = [target_text] if options.raw else list(forced_targets(prepared, target_text, self.target))
        segments = zip(prepared.segments, targets, strict=True)
        return prepared, [self._request(s.source, options, True, t) for s, t in segments]
