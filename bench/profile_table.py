"""A py-spy profile of a server under load, and its top entries as Markdown tables (bench/overhead.py).

py-spy (``pip install py-spy``) attaches to the server's process, samples every thread's Python and native stack
(``--native --threads``, raw collapsed stacks) while the load runs, and stops on SIGINT. Samples of a thread that
waits (for work, for the socket, for a lock it has not got) are left out: they cost no CPU. Native frames without
a symbol (libc's, mostly) are named by their library.

py-spy cannot tell a thread that runs from one that is ready but waits for the core: on one core, the thread that
the other one preempted is counted as running. Where Linux's ``perf`` is installed, it samples the same load by the
kernel's CPU clock, which ticks only for the thread on the core: its shares by thread and library are CPU time.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from common import Server

WAITING = (  # frames under which a thread sleeps, not runs
    "Event.wait ",
    "Condition.wait ",
    "select ",
    "epoll_wait",
    "uv__io_poll",
    "take_gil",
    "clock_nanosleep",
    "PyThread_acquire_lock_timed",
    "do_futex_wait",
    "__futex_abstimed_wait",
)
LINE = re.compile(r":\d+\)")
ADDRESS = re.compile(r"^0x[0-9a-f]+ ")  # a native frame without a symbol: its library stands for it
PARTS = (  # (part, frame marker): a sample belongs to the part of the frame nearest its leaf that has a marker
    ("ONNX Runtime", "onnxruntime"),
    ("attention kernels (service/runtime/_attention.c)", "_attention.c"),
    ("tokenizer (encode, decode)", "Tokenizer."),
    ("answers handed to the event loop", "_settle"),
    ("queueing and waiting (submit, futures, deadline)", "Engine._wait"),
    ("body parsing and validation", "json_body"),
    ("body parsing and validation", "parse_body"),
    ("decoding loop (search, batch, caches)", "service/decoding/"),
    ("decoding loop (runner)", "service/runtime/runner.py"),
    ("scheduler (queueing, batching loop)", "service/serving/scheduler.py"),
    ("engine, other (checks, spans, budget)", "service/serving/engine.py"),
    ("engine, other (checks, spans, budget)", "service/text/"),
    ("engine, other (checks, spans, budget)", "service/serving/budget.py"),
    ("route, other (admission, answer, response)", "service/http/routes/"),
    ("route, other (admission, answer, response)", "service/http/lean.py"),
    ("route, other (admission, answer, response)", "service/http/ratelimit.py"),
    ("metrics (prometheus_client)", "prometheus_client"),
    ("attnserve middleware (limits, drain, deadlines, metrics)", "service/http/"),
    ("FastAPI and Starlette (routing, middleware, responses)", "fastapi/"),
    ("FastAPI and Starlette (routing, middleware, responses)", "starlette/"),
    ("uvicorn and httptools (HTTP protocol)", "uvicorn/"),
    ("uvicorn and httptools (HTTP protocol)", "httptools"),
    ("asyncio and uvloop (event loop)", "asyncio/"),
    ("asyncio and uvloop (event loop)", "loop.c"),
)
LIBRARIES = (  # (library, marker in perf's shared-object name)
    ("ONNX Runtime", "onnxruntime"),
    ("attention kernels (service/runtime/_attention.c)", "_attention."),
    ("beam search (service/runtime/_beam.c)", "_beam."),
    ("Python interpreter", "libpython"),
    ("numpy", "_multiarray_umath"),
    ("libc (copies, malloc)", "libc.so"),
    ("Linux kernel (system calls, scheduling)", "[kernel"),
    ("SentencePiece", "_sentencepiece"),
    ("uvloop", "loop.cpython"),
    ("httptools", "parser.cpython"),
    ("pydantic-core", "_pydantic_core"),
)
PERF_ROW = re.compile(r"^\s*([\d.]+)%\s+(\d+):\S*\s+(\S.*?)\s*$")  # perf report --sort pid,dso
OURS = ("service/", "starlette/", "fastapi/", "uvicorn/", "pydantic", "anyio/", "json", "msgspec")  # inclusive rows


@dataclass(frozen=True)
class Profile:
    stacks: Counter[tuple[str, ...]]  # frames root first (thread name first), line numbers dropped -> samples
    waiting: int  # samples left out
    cpu: dict[str, float] = field(default_factory=dict)  # thread name -> CPU seconds during the load
    seconds: float = 0.0  # of load
    libraries: dict[tuple[str, str], float] = field(default_factory=dict)  # (thread, library) -> CPU share (perf)

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())


def record_profile(server: Server, load: Callable[[], object], rate: int = 100) -> Profile:
    """Run ``load()`` with py-spy sampling ``server``'s process (py-spy runs on the load generator's core)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = Path(tempfile.mkdtemp(prefix="profile-")) / "profile.txt"
    command = [spy, "record", "--pid", str(server.process.pid), "--native", "--threads", "--rate", str(rate)]
    command += ["--format", "raw", "--output", str(out)]
    spying = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    perf, perf_data = _start_perf(server.process.pid)
    time.sleep(1.0)  # attached before the load starts
    before, start = thread_cpu(server.process.pid), time.perf_counter()
    try:
        load()
        seconds = time.perf_counter() - start
        after = thread_cpu(server.process.pid)
    finally:
        spying.send_signal(signal.SIGINT)
        _, err = spying.communicate(timeout=60)
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait(timeout=60)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote no profile:\n{err.decode()[-2000:]}")
    profile = parse(out.read_text())
    names = {}  # py-spy's first frame: "thread (TID): NAME", TID the OS thread id
    for stack in profile.stacks:
        tid, _, name = stack[0].removeprefix("thread (").partition("): ")
        names[tid] = name
    cpu: dict[str, float] = {}
    for tid, seconds_ in after.items():
        name = names.get(tid, "other threads")
        cpu[name] = cpu.get(name, 0.0) + seconds_ - before.get(tid, 0.0)
    libraries: dict[tuple[str, str], float] = {}
    if perf is not None:
        report = [shutil.which("perf") or "perf", "report", "-i", str(perf_data), "--no-children", "--sort", "pid,dso"]
        done = subprocess.run([*report, "-g", "none", "--stdio"], capture_output=True, text=True)
        libraries = perf_shares(done.stdout, names)
    return replace(profile, cpu=cpu, seconds=seconds, libraries=libraries)


def _start_perf(pid: int) -> tuple[subprocess.Popen[bytes] | None, Path]:
    """``perf record`` of the process by the CPU clock, when perf is installed (None otherwise)."""
    data = Path(tempfile.mkdtemp(prefix="perf-")) / "perf.data"
    perf = shutil.which("perf")
    if perf is None:
        return None, data
    command = [perf, "record", "-e", "cpu-clock", "-F", "999", "-p", str(pid), "-o", str(data)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), data


def perf_shares(report: str, names: dict[str, str]) -> dict[tuple[str, str], float]:
    """``perf report --sort pid,dso`` rows as shares of the samples by (thread, library): a thread by its name
    in ``names`` (OS thread id -> name, py-spy's), a library by :data:`LIBRARIES` or its own file name."""
    shares: dict[tuple[str, str], float] = {}
    for line in report.splitlines():
        if (row := PERF_ROW.match(line)) is None:
            continue
        percent, tid, dso = row.groups()
        library = next((name for name, marker in LIBRARIES if marker in dso), dso)
        key = (names.get(tid, "other threads"), library)
        shares[key] = shares.get(key, 0.0) + float(percent) / 100
    return shares


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of a process so far, by OS thread id, from /proc: what each
    thread really ran, where a sampler counts a thread that waits for the core as running."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        utime, stime = (int(x) for x in stat[stat.rindex(")") + 2 :].split()[11:13])
        out[task.name] = (utime + stime) / tick
    return out


def record_command(command: list[str], rate: int = 100) -> Profile:
    """Run ``command`` under py-spy from its start to its end (a process of its own, such as an offline engine)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = Path(tempfile.mkdtemp(prefix="profile-")) / "profile.txt"
    spying = [spy, "record", "--native", "--threads", "--rate", str(rate), "--format", "raw", "--output", str(out)]
    proc = subprocess.run([*spying, "--", *command], capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy or the command failed:\n{proc.stderr[-2000:]}")
    return parse(out.read_text())


def parse(raw: str) -> Profile:
    """py-spy's raw format: one ``frame;frame;... count`` line per distinct stack."""
    stacks: Counter[tuple[str, ...]] = Counter()
    waiting = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        if any(w in stack for w in WAITING):
            waiting += int(count)
            continue
        frames = tuple(ADDRESS.sub("", LINE.sub(")", f)) for f in stack.split(";"))
        stacks[frames] += int(count)
    return Profile(stacks, waiting)


def thread_name(frame: str) -> str:
    """``thread (123): attnserve-decode`` -> ``attnserve-decode``; the main thread (the event loop) otherwise."""
    name = frame.partition(": ")[2]
    return name or frame


def top(profile: Profile, inclusive: bool, n: int = 15) -> list[tuple[str, int]]:
    """The ``n`` frames with the most samples: where the stacks end (self), or anywhere in them (inclusive)."""
    counts: Counter[str] = Counter()
    for stack, k in profile.stacks.items():
        frames = stack[1:] or stack
        if inclusive:
            for frame in set(frames):
                if any(o in frame for o in OURS):
                    counts[frame] += k
        else:
            counts[frames[-1]] += k
    return counts.most_common(n)


def part(stack: tuple[str, ...]) -> str:
    """The part of the server a sample is in (:data:`PARTS`), by the frame nearest its leaf that has a marker."""
    for frame in reversed(stack):
        for name, marker in PARTS:
            if marker in frame:
                return name
    return "other (interpreter, libc)"


def parts_table(profile: Profile) -> list[str]:
    """Per thread, the share of all running samples that each part took."""
    total = profile.samples or 1
    counts: Counter[tuple[str, str]] = Counter()
    for stack, k in profile.stacks.items():
        counts[(thread_name(stack[0]), part(stack))] += k
    rows = ["| thread | part | share |", "|---|---|---|"]
    ordered = sorted(counts.items(), key=lambda x: (x[0][0], -x[1]))
    rows += [f"| {t} | {p} | {k / total:.1%} |" for (t, p), k in ordered]
    return rows


def profile_section(profile: Profile, name: str, command: str, what: str = "the float32 server under that load") -> str:
    """The profile's threads, top self and top inclusive frames, as a section of docs/BENCHMARKS.md."""
    total = profile.samples or 1
    threads: Counter[str] = Counter()
    for stack, k in profile.stacks.items():
        threads[thread_name(stack[0])] += k
    lines = [
        f"### Profile of {what}: {name} (bench/overhead.py --profile)",
        "",
        f"`{command}` — py-spy 100 Hz, `--native --threads`; {profile.samples} running samples "
        f"({profile.waiting} waiting left out). Shares of the running samples.",
        "",
        "| thread | share of running samples |",
        "|---|---|",
        *(f"| {t} | {k / total:.1%} |" for t, k in threads.most_common()),
    ]
    if profile.cpu:
        used = sum(profile.cpu.values()) or 1.0
        lines += ["", f"CPU time of the server's threads over the {profile.seconds:.1f} s of load (/proc), all of "
                  f"them {used:.1f} s:", "", "| thread | CPU s | share |", "|---|---|---|"]  # fmt: skip
        busy = sorted(profile.cpu.items(), key=lambda x: -x[1])
        lines += [f"| {t} | {c:.2f} | {c / used:.1%} |" for t, c in busy if c >= 0.01]
    if profile.libraries:
        lines += ["", "CPU time by thread and library (`perf record -e cpu-clock`: a thread is sampled only while it "
                  "runs on the core, where py-spy also counts one that waits for it; libraries under 0.5 % left out):",
                  "", "| thread | library | share of CPU |", "|---|---|---|"]  # fmt: skip
        ordered = sorted(profile.libraries.items(), key=lambda x: (x[0][0], -x[1]))
        lines += [f"| {t} | {lib} | {k:.1%} |" for (t, lib), k in ordered if k >= 0.005]
    lines += ["", "py-spy's samples by part of the server:", ""]
    lines += [*parts_table(profile), "", "| top frames, self (where the stack ends) | share |", "|---|---|"]
    lines += [f"| `{f}` | {k / total:.1%} |" for f, k in top(profile, False)]
    return "\n".join(lines) + "\n"
