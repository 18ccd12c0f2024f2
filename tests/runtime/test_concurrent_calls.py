"""Splitting the thread budget among concurrent calls of one graph (runtime/concurrent_calls.py)."""

import pytest

from ncnnport.runtime.concurrent_calls import CallSplit, run_each, split_threads


@pytest.mark.parametrize("threads, concurrent, split", [
    (16, 4, CallSplit(4, 4)),   # the device's 16 threads over a 448 image's 4 windows
    (2, 4, CallSplit(2, 1)),    # fewer threads than calls: one thread each
    (4, 4, CallSplit(4, 1)),
    (6, 4, CallSplit(3, 2)),    # ceil(6/4) = 2 threads each leaves room for 3 calls
    (5, 4, CallSplit(2, 2)),    # the fifth thread idles rather than make one call faster
    (1, 4, CallSplit(1, 1)),
    (8, 1, CallSplit(1, 8)),    # a graph without the hint keeps every thread on its one call
])
def test_split_threads(threads, concurrent, split):
    assert split_threads(threads, concurrent) == split
    assert split.workers * split.threads_each <= threads


@pytest.mark.parametrize("threads, concurrent", [(0, 4), (4, 0), (-1, 1)])
def test_split_threads_rejects_nonsense(threads, concurrent):
    with pytest.raises(ValueError):
        split_threads(threads, concurrent)


def test_run_each_on_a_runner_without_it_runs_the_calls_in_order():
    class Recorder:  # a torch runner or a RecordingRunner: no run_each
        def __init__(self):
            self.seen = []

        def run(self, arrays):
            self.seen.append(arrays[0])
            return [arrays[0] * 2]

    rec = Recorder()
    assert run_each(rec, [[1], [2], [3]]) == [[2], [4], [6]]
    assert rec.seen == [1, 2, 3]
