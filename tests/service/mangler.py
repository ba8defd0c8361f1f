"""A model that mangles its stand-ins, for the tests of restoring (service/serving/restoring.py) and of what
/translate and /attention give when it answers: :class:`Mangler` writes "A {lg} B 7" (a broken stand-in and a
made-up number), and a constrained search drives it to "A {0}"."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime.bundle import ModelSpec
from service.runtime.manifest import Manifest
from service.runtime.runner import StepInput, StepOutput
from service.serving.engine import Engine, Runners
from service.settings import Settings
from tests.service.fake_runner import FakeRunner

PIECES = ["</s>", "<unk>", "▁{0}", "▁{", "0", "}", "▁A", "▁B", "lg", "▁{1}", "1", "▁C", "▁D", "▁7", "▁E", "<pad>"]
EOS, PAD = 0, 15
SPEC = ModelSpec(
    vocab_size=16, d_model=4, h=2, n_encoder_layers=1, n_decoder_layers=1, max_positions=64,
    pad_id=PAD, eos_id=EOS, unk_id=1, decoder_start_id=PAD,
)  # fmt: skip
MANGLED = [6, 3, 8, 5, 7, 13, EOS]  # "A {lg} B 7": a broken stand-in and a made-up number
FALLBACK = [2, 9, EOS, 4, 10, 5, 6, 7, 11, 12, 14, 8, 3, 13, 1]  # preferences once off the script


class Tokenizer:
    """Words of a source are pieces; any other word is ▁C."""

    special = frozenset({EOS, PAD})
    target_prefix: tuple[int, ...] = ()

    def encode_source(self, text: str) -> list[int]:
        ids = {p.lstrip("▁"): i for i, p in enumerate(PIECES)}
        return [ids.get(w, 11) for w in text.split()] + [EOS]

    def encode_target(self, text: str) -> list[int]:
        return self.encode_source(text)

    def pieces(self, ids: list[int]) -> list[str]:
        return [PIECES[i] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return "".join(PIECES[i] for i in ids if i not in self.special).replace("▁", " ").strip()

    @property
    def target(self) -> Any:
        return self

    def decode_pieces(self, pieces: list[str]) -> str:
        return "".join(pieces).replace("▁", " ").strip()


@dataclass
class Bundle:
    spec: ModelSpec = SPEC
    tokenizer: Tokenizer = field(default_factory=Tokenizer)
    name: str = "mangler"
    source_lang: str = "en"
    target_lang: str = "ja"
    manifest: Manifest = field(default_factory=lambda: Manifest({"source_lang": "en", "target_lang": "ja"}))
    path: Path = Path("mangler")  # no files: nothing on disk to count
    targets: dict[str, list[int]] = field(default_factory=lambda: {"ja": []})

    def served_variant(self, override: str | None) -> str:
        return override or self.manifest.default_variant


class Mangler(FakeRunner):
    """Writes MANGLED while its prefix follows it; off the script, FALLBACK's order (a stand-in first, then </s>).
    Its cross-attention puts every step on the source's second token (where "{0}" is in "C {0} C")."""

    spec = SPEC
    attention = True
    provider = "fake"

    def step(self, step: StepInput) -> StepOutput:
        input_ids, position_ids, self_mask = step.input_ids, step.position_ids, step.self_attention_mask
        assert self_mask is not None, "appended caches"
        B = len(input_ids)
        new = np.zeros((B, 2, 1, 2), np.float32)
        new[:, 0, 0, 0], new[:, 0, 0, 1] = input_ids[:, 0], position_ids[:, 0]
        keys = np.concatenate([step.past_keys[0], new], axis=2)
        logits = np.full((B, 16), -20.0, np.float32)
        for b in range(B):
            owned = keys[b, 0, np.flatnonzero(self_mask[b] == 1)]
            prefix = [int(t) for t in owned[np.argsort(owned[:, 1]), 0][1:]]
            on_script = prefix == MANGLED[: len(prefix)] and len(prefix) < len(MANGLED)
            order = ([MANGLED[len(prefix)]] if on_script else []) + FALLBACK
            for rank, token in enumerate(dict.fromkeys(order)):
                logits[b, token] = 10.0 - rank
        T, S = keys.shape[2], step.cross_keys[0].shape[2]
        cross = np.zeros((1, B, 2, S), np.float32)
        cross[:, :, :, 1] = 1.0
        return StepOutput(logits, [keys], [keys.copy()], np.zeros((1, B, 2, T), np.float32), cross)


def mangler_engine() -> Engine:
    runner = Mangler()
    return Engine(Bundle(), Settings(max_wait_ms=1), Runners(runner, runner))  # type: ignore[arg-type]
