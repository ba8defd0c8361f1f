"""A bundle's exact float32 runner on the CPU where /translate is served by other graphs: its sessions open on the
first call that needs them (/attention, ``return_details``, span placement), so a bundle that never gets one holds
only the weights of the graphs it serves (docs/BENCHMARKS.md, "Memory of a loaded bundle")."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from service.runtime.bundle import Bundle
from service.runtime.providers import CPU
from service.runtime.runner import AppendedRunner, EncoderOutput, StepInput, StepOutput
from service.runtime.tensors import HostTensors


class OnFirstUse:
    """The runner that ``build`` makes, made on the first encode, step or cross-attention call (once, whichever
    thread asks first); what the engine reads before that (spec, form, tensors, attention, provider, has_forced) is
    the bundle's, as the exact CPU runner gives it.

    Args:
        build: the exact float32 runner of ``bundle`` on the CPU (sharing the served runner's encoder session where
            it is the same graph).
        bundle: the bundle ``build`` opens.
    """

    def __init__(self, build: Callable[[], AppendedRunner], bundle: Bundle) -> None:
        self._build = build
        self._runner: AppendedRunner | None = None
        self._lock = threading.Lock()
        self.spec = bundle.spec
        self.form = bundle.form("decoder")
        self.tensors = HostTensors()
        self.attention = bundle.form("encoder").attentions and self.form.attentions
        self.provider = CPU
        self.has_forced = bundle.has_graph("forced_decoder")

    @property
    def loaded(self) -> bool:
        """Whether the sessions are open."""
        return self._runner is not None

    @property
    def runner(self) -> AppendedRunner:
        """The runner, opened now if it is not yet."""
        if self._runner is None:
            with self._lock:
                if self._runner is None:
                    self._runner = self._build()
        return self._runner

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> EncoderOutput:
        return self.runner.encode(input_ids, attention_mask, position_ids)

    def step(self, step: StepInput) -> StepOutput:
        return self.runner.step(step)

    def cross_attention(self, sources: list[list[int]], targets: list[list[int]]) -> list[np.ndarray]:
        return self.runner.cross_attention(sources, targets)
