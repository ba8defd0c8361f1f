"""SCHED_BATCH for every thread: always, or while a decoding batch is nearly full."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from service.serving.core_sharing import WhileSaturated

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_BATCH: Linux only")

BATCH_SCHEDULING = """
import os, threading
from service.serving.core_sharing import batch_scheduling
before = threading.Thread(target=threading.Event().wait, daemon=True)
before.start()
applied = batch_scheduling()
after = threading.Thread(target=lambda: print(os.sched_getscheduler(0)))
after.start()
after.join()
threads = [int(t) for t in os.listdir("/proc/self/task") if t != str(after.native_id)]
print(applied, sorted({os.sched_getscheduler(t) for t in threads}))
print(batch_scheduling(on=False), sorted({os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}))
"""


@linux
def test_batch_scheduling_holds_for_every_thread_and_those_started_after_until_turned_off() -> None:
    run = subprocess.run([sys.executable, "-c", BATCH_SCHEDULING], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    batch, other = os.SCHED_BATCH, os.SCHED_OTHER
    assert run.stdout.split("\n") == [str(batch), f"True [{batch}]", f"True [{other}]", ""]


class Applied(list[bool]):
    """The policies a WhileSaturated applied, in order; ``works`` False: the system refuses them."""

    works = True

    def __call__(self, on: bool) -> bool:
        self.append(on)
        return self.works


def test_saturation_switches_at_three_quarters_and_back_once_empty() -> None:
    applied = Applied()
    policy = WhileSaturated(32, applied)
    assert policy.enter == 24
    for rows in (1, 12, 23):
        policy.observe("a", rows)
    assert applied == [] and not policy.on
    policy.observe("a", 24)
    assert applied == [True] and policy.on
    for rows in (30, 20, 1, 28):  # until the batch has emptied nothing switches
        policy.observe("a", rows)
    assert applied == [True]
    policy.observe("a", 0)
    assert applied == [True, False] and not policy.on


def test_saturation_rounds_its_mark_up_for_small_batches() -> None:
    applied = Applied()
    policy = WhileSaturated(1, applied)
    assert policy.enter == 1
    policy.observe("a", 1)
    policy.observe("a", 0)
    assert applied == [True, False]


def test_saturation_holds_while_any_decoding_thread_is_saturated() -> None:
    applied = Applied()
    policy = WhileSaturated(8, applied)
    policy.observe("a", 8)
    policy.observe("b", 8)
    policy.observe("a", 0)
    assert applied == [True]  # b is still full
    policy.observe("b", 0)
    assert applied == [True, False]


def test_saturation_reports_from_several_threads_switch_once_each_way() -> None:
    applied = Applied()
    policy = WhileSaturated(8, applied)
    threads = [threading.Thread(target=policy.observe, args=(i, 8)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert applied == [True]


def test_a_system_that_refuses_the_policy_is_asked_once(caplog: pytest.LogCaptureFixture) -> None:
    applied = Applied()
    applied.works = False
    policy = WhileSaturated(4, applied)
    for rows in (4, 0, 4, 0):
        policy.observe("a", rows)
    assert applied == [True] and not policy.on
    assert "SCHED_BATCH is not available" in caplog.text
