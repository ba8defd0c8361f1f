"""How the server's threads share a CPU core: Linux's ``SCHED_BATCH`` for every thread, always or only while a
decoding batch is nearly full (``ATTNSERVE_SCHED_BATCH``).

Where the event loop and a decoding thread share a core, each request's bytes arriving wake the event loop in the
middle of a decoding step, and Linux hands it the core at once (wakeup preemption): the two threads trade the core
several times a request, and each runs on caches the other has just filled with its own data. Under
``SCHED_BATCH`` a woken thread waits for the running one to sleep or use up its time slice, so each runs in longer
stretches and more texts are decoded a second; but a request arriving at a busy core waits too, which costs latency
under moderate load (docs/BENCHMARKS.md). On an idle core a woken thread still runs at once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)
UNAVAILABLE = "SCHED_BATCH is not available here; threads keep the default scheduling"


def batch_scheduling(on: bool = True) -> bool:
    """Every thread of the process under ``SCHED_BATCH`` (``on``) or the default policy, and so every thread they
    start; whether it applied (elsewhere than Linux, or where a sandbox forbids it, nothing changes)."""
    setscheduler = getattr(os, "sched_setscheduler", None)
    if setscheduler is None:  # not Linux
        return False
    policy = os.SCHED_BATCH if on else os.SCHED_OTHER
    for thread in os.listdir("/proc/self/task"):  # numpy's and ONNX Runtime's imports start threads too
        try:
            setscheduler(int(thread), policy, os.sched_param(0))
        except ProcessLookupError:  # it ended meanwhile
            continue
        except OSError:  # a seccomp profile or other sandbox that refuses it
            return False
    return True


class WhileSaturated:
    """``SCHED_BATCH`` for every thread from when some decoding thread's batch holds 3/4 of ``max_batch_size`` rows
    or more after a step, the default policy again once every batch has emptied.

    At saturation a request arriving waits for a row anyway, and texts per second are what the core's time buys;
    below it, a request arriving should run at once. Under ``SCHED_BATCH`` the event loop runs in longer, rarer
    stretches and so hands requests over in bursts: a saturated batch drains far under its mark between them, and
    leaving at any mark above empty would switch the policy back and forth many times a second.

    Args:
        max_batch_size: the rows a batch may hold.
        apply: sets the policy of every thread (:func:`batch_scheduling`); once it fails, nothing is switched again.
    """

    def __init__(self, max_batch_size: int, apply: Callable[[bool], bool] = batch_scheduling) -> None:
        self.enter = -(-3 * max_batch_size // 4)
        self.apply = apply
        self.on = False
        self._saturated: set[Hashable] = set()  # the decoding threads saturated since their batch last emptied
        self._lock = threading.Lock()  # several decoding threads report
        self._broken = False

    def observe(self, decoder: Hashable, rows: int) -> None:
        """``decoder``'s batch holds ``rows`` rows after its step."""
        with self._lock:
            if rows >= self.enter:
                self._saturated.add(decoder)
            elif not rows:
                self._saturated.discard(decoder)
            want = bool(self._saturated)
            if want == self.on or self._broken:
                return
            if not self.apply(want):
                self._broken = True
                log.warning(UNAVAILABLE)
                return
            self.on = want
