"""One language pair: a bundle's tokenizer, runner and scheduler, and the text <-> decode-request translation that
the HTTP API and the command line share (so both give the same answers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.bundle import Bundle, load_bundle
from service.decoding import BatchDecoder, DecodeRequest, DecodeResult, Hypothesis, decode
from service.runner import CPU, Provider, Runner
from service.scheduler import Scheduler
from service.settings import Settings

log = logging.getLogger(__name__)

KINDS = ("encoder", "decoder", "cross")


class InputError(ValueError):
    """A request breaks a limit or names something that does not exist; ``status`` is the HTTP code to answer."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Options:
    """Decoding options of one request, already checked against the limits."""

    beam_size: int = 1
    max_length: int | None = None
    n_best: int = 1
    length_penalty: float = 1.0
    attention: bool = False


class Engine:
    """A loaded bundle with its runners; :meth:`start` adds the schedulers that the HTTP service uses.

    The exact float32 graphs serve /attention. /translate uses the ``graph_variant`` graphs through schedulers of
    their own: for float32 on the CPU the fast decoder (caches written in place, no attention outputs; on CUDA the
    exact graphs and their schedulers), for int8 its quantized one, for float16 its exact graphs. Texts that need
    attention rows (``return_details``) go to the exact graphs when the variant's decoder has no attention outputs.
    A runner has ``decode_threads`` schedulers (batching loops, each on its thread), which call its sessions
    concurrently; a request goes to the least busy one.
    """

    def __init__(self, bundle: Bundle, settings: Settings, provider: Provider | None = None) -> None:
        self.bundle = bundle
        self.settings = settings
        self.tokenizer = bundle.tokenizer
        provider = provider or settings.provider
        self.exact = Runner(bundle, provider, settings.threads)
        variant = settings.graph_variant
        if variant != "float32":
            self.fast = Runner(bundle, provider, settings.threads, variant)
        elif self.exact.provider == CPU:
            self.fast = Runner(bundle, provider, settings.threads, fast=True, encoder=self.exact.encoder)
        else:  # the fast decoder's attention kernels (service/_attention.c) are the CPU's
            self.fast = self.exact
        self.schedulers: dict[str, list[Scheduler]] = {}  # "exact", "fast": one per decoding thread

    @classmethod
    def load(cls, path: Path, settings: Settings) -> Engine:
        return cls(load_bundle(path), settings)

    @property
    def pair(self) -> tuple[str, str]:
        return self.bundle.source_lang, self.bundle.target_lang

    async def start(self, on_step: Any = None) -> None:
        s = self.settings
        for name, runner in (("exact", self.exact), ("fast", self.fast)):
            if name == "fast" and runner is self.exact:  # float32 on CUDA: one runner, one set of schedulers
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
                    on_step=on_step,
                )
                for _ in range(s.decode_threads)
            ]
            for scheduler in self.schedulers[name]:
                await scheduler.start()

    async def stop(self) -> None:
        for scheduler in self._unique_schedulers():
            await scheduler.stop()

    def _unique_schedulers(self) -> list[Scheduler]:
        return list({id(s): s for group in self.schedulers.values() for s in group}.values())

    @property
    def queue_depth(self) -> int:
        return sum(s.queue_depth for s in self._unique_schedulers())

    @property
    def active_sequences(self) -> int:
        return sum(s.active_sequences for s in self._unique_schedulers())

    def request(self, text: str, options: Options, target_text: str | None = None) -> DecodeRequest:
        """Tokenize and check one text against the limits.

        Raises:
            InputError: the text is over ``max_chars`` / ``max_tokens`` (413), or the target text is.
        """
        s = self.settings
        if len(text) > s.max_chars:
            raise InputError(f"a text has {len(text)} characters; the limit is max_chars={s.max_chars}", 413)
        src = self.tokenizer.encode_source(text)
        limit = min(s.max_tokens, self.bundle.spec.max_positions)
        if len(src) > limit:
            raise InputError(f"a text has {len(src)} tokens; the limit is max_tokens={limit}", 413)
        forced = None
        if target_text is not None:
            if len(target_text) > s.max_chars:
                raise InputError(f"target_text has {len(target_text)} characters; the limit is {s.max_chars}", 413)
            forced = self.tokenizer.encode_target(target_text)
            if len(forced) > min(s.max_length, self.bundle.spec.max_positions):
                raise InputError(f"target_text has {len(forced)} tokens; the limit is max_length={s.max_length}", 413)
        max_length = options.max_length or min(s.max_length, 2 * len(src) + 10)
        max_length = min(max_length, self.bundle.spec.max_positions)
        return DecodeRequest(
            src=src,
            beam_size=options.beam_size,
            max_length=max_length,
            length_penalty=options.length_penalty,
            n_best=options.n_best,
            forced=forced,
            attention=options.attention,
            scores=options.attention,  # return_details, the one answer that reports scores, also asks for attention
        )

    def _exact(self, requests: list[DecodeRequest], exact: bool) -> bool:
        return exact or (not self.fast.attention and any(r.attention for r in requests))

    def enqueue(self, requests: list[DecodeRequest], exact: bool = False) -> list[asyncio.Future[DecodeResult]]:
        """Queue texts together on the least busy scheduler (on the event loop); ``exact`` for the float32 graphs
        (/attention). Cancelling a future frees its text's rows.

        Raises:
            QueueFull: the scheduler has no room for them all.
        """
        assert self.schedulers, "Engine.start() was not called"
        group = self.schedulers["exact" if self._exact(requests, exact) else "fast"]
        scheduler = group[0] if len(group) == 1 else min(group, key=lambda s: s.queue_depth + s.active_sequences)
        return scheduler.submit_many(requests, self.settings.request_timeout_s)  # on the least busy

    def decode_now(self, requests: list[DecodeRequest], exact: bool = False) -> list[DecodeResult]:
        """Decode without a scheduler (the command line), on the same graphs as :meth:`enqueue`."""
        return decode(self.exact if self._exact(requests, exact) else self.fast, requests)

    def text(self, hyp: Hypothesis) -> str:
        return self.tokenizer.decode(hyp.tokens)

    def details(self, request: DecodeRequest, hyp: Hypothesis) -> dict[str, Any]:
        """Tokens, scores and a word alignment (each target token's most attended source token, last layer, heads
        averaged) for ``return_details``."""
        cross = np.stack(hyp.cross_attention)  # (T, L, h, S)
        alignment = cross[:, -1].mean(axis=1).argmax(axis=-1)
        return {
            "source_tokens": self.tokenizer.pieces(request.src),
            "tokens": self.tokenizer.pieces(hyp.tokens),
            "score": round(hyp.score, 6),
            "token_scores": [round(x, 6) for x in hyp.token_scores],
            "alignment": [int(a) for a in alignment],
        }

    def attention(
        self,
        request: DecodeRequest,
        result: DecodeResult,
        kinds: Sequence[str],
        layers: list[int] | None,
        heads: list[int] | None,
    ) -> dict[str, Any]:
        """The /attention response body: tokens, translation and [layer][head][query][key] arrays per kind."""
        hyp = result.hypotheses[0]
        T = len(hyp.tokens)
        L_dec = self.bundle.spec.n_decoder_layers
        self_att = np.zeros((L_dec, self.bundle.spec.h, T, T), np.float32)
        for t, row in enumerate(hyp.self_attention):  # row (L, h, t + 1): no position attends to a later one
            self_att[:, :, t, : t + 1] = row
        arrays = {
            "encoder": result.encoder_attention,  # (L_enc, h, S, S)
            "decoder": self_att,
            "cross": np.stack(hyp.cross_attention, axis=2),  # (L_dec, h, T, S)
        }
        start = self.tokenizer.pieces([self.bundle.spec.decoder_start_id])
        body: dict[str, Any] = {
            "source_tokens": self.tokenizer.pieces(request.src),
            "target_tokens": self.tokenizer.pieces(hyp.tokens),
            "decoder_input_tokens": start + self.tokenizer.pieces(hyp.tokens[:-1]),
            "translatedText": self.text(hyp),
            "layers": {},
            "heads": list(range(self.bundle.spec.h)) if heads is None else heads,
        }
        for kind in kinds:
            a = arrays[kind]
            assert a is not None
            chosen = list(range(a.shape[0])) if layers is None else layers
            body["layers"][kind] = chosen
            body[kind] = np.round(a[chosen][:, body["heads"]].astype(np.float64), 6).tolist()
        return body

    def check_filters(self, kinds: Sequence[str], layers: list[int] | None, heads: list[int] | None) -> None:
        """Raises InputError (422) for a layer or head index that does not exist in the requested kinds."""
        spec = self.bundle.spec
        for kind in kinds:
            n = spec.n_encoder_layers if kind == "encoder" else spec.n_decoder_layers
            bad = [i for i in layers or [] if not 0 <= i < n]
            if bad:
                raise InputError(f"layers {bad} do not exist for {kind} attention: it has layers 0..{n - 1}")
        bad = [i for i in heads or [] if not 0 <= i < spec.h]
        if bad:
            raise InputError(f"heads {bad} do not exist: the model has heads 0..{spec.h - 1}")


def warm_up(engine: Engine) -> None:
    """Decode one short text so that the first real request does not pay for ONNX Runtime's lazy set-up."""
    engine.decode_now([engine.request("Hello.", Options(max_length=4))])
