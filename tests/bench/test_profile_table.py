"""bench/profile_table.py: perf's CPU samples by thread and library, and the profile section that shows them."""

from __future__ import annotations

from collections import Counter

import profile_table

REPORT = """\
# Samples: 16K of event 'cpu-clock'
#
    56.88%    12748:attnserve  onnxruntime_pybind11_state.cpython-311-x86_64-linux-gnu.so
    12.81%    12744:attnserve  libpython3.11.so.1.0
     9.52%    12748:attnserve  _attention.cpython-311-x86_64-linux-gnu.so
     6.20%    12748:attnserve  libpython3.11.so.1.0
     1.92%    12744:attnserve  [kernel.kallsyms]
     0.80%    12744:attnserve  loop.cpython-311-x86_64-linux-gnu.so
     0.40%    12746:attnserve  libfoo.so
"""


def test_perf_rows_are_shares_by_thread_and_library() -> None:
    names = {"12744": "MainThread", "12748": "attnserve-decode"}
    shares = profile_table.perf_shares(REPORT, names)
    expected = {
        ("attnserve-decode", "ONNX Runtime"): 0.5688,
        ("attnserve-decode", "attention kernels (service/runtime/_attention.c)"): 0.0952,
        ("attnserve-decode", "Python interpreter"): 0.0620,
        ("MainThread", "Python interpreter"): 0.1281,
        ("MainThread", "Linux kernel (system calls, scheduling)"): 0.0192,
        ("MainThread", "uvloop"): 0.0080,
        ("other threads", "libfoo.so"): 0.0040,  # a thread py-spy never saw; a library by its file's name
    }
    assert shares.keys() == expected.keys()
    for key, share in expected.items():
        assert abs(shares[key] - share) < 1e-9, key


def test_the_section_shows_perf_shares_when_there_are_some() -> None:
    stacks = Counter({("thread (1): MainThread", "run (uvicorn/server.py)"): 3})
    plain = profile_table.Profile(stacks, waiting=1)
    section = profile_table.profile_section(plain, "after", "python bench/overhead.py --profile after")
    assert "perf record" not in section
    shares = {("MainThread", "Python interpreter"): 0.2, ("MainThread", "uvloop"): 0.001}
    with_perf = profile_table.Profile(stacks, waiting=1, libraries=shares)
    section = profile_table.profile_section(with_perf, "after", "python bench/overhead.py --profile after")
    assert "| MainThread | Python interpreter | 20.0% |" in section
    assert "uvloop" not in section  # under half a percent
