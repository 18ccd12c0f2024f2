"""The thread split of concurrent calls is one rule in two runtimes: the C++ executable's table
(`ncnnport-cpp splits`) must be runtime/concurrent_calls.split_threads at every thread count up
to 128 and every concurrent_calls up to 16 (the executable test checks one split, at 3 threads)."""

from __future__ import annotations

import json
import subprocess

import pytest

from ncnnport.runtime.concurrent_calls import split_threads
from tests.cpp.make_targets import ROOT

EXE = ROOT / "build" / "cpp" / "ncnnport-cpp"


@pytest.mark.slow
def test_cpp_thread_splits_are_the_python_rule(built_cpp):
    exe = built_cpp(EXE, "NCNNPORT_CPP_EXE")
    res = subprocess.run([str(exe), "splits", "128", "16"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert len(rows) == 128 * 16
    for threads, calls, workers, each in rows:
        split = split_threads(threads, calls)
        assert (workers, each) == (split.workers, split.threads_each), (threads, calls)
        assert workers * each <= threads  # never more threads than asked for


@pytest.mark.slow
@pytest.mark.parametrize("args", [["0", "4"], ["4", "0"], ["x", "4"], ["4"]])
def test_cpp_splits_refuses_bad_counts_with_usage(built_cpp, args):
    exe = built_cpp(EXE, "NCNNPORT_CPP_EXE")
    res = subprocess.run([str(exe), "splits", *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "usage:" in res.stderr
