"""Independent calls of one graph side by side: how the thread budget is split among them.

A Youtu-VL window layer is one graph called once per window (144-256 rows). One such call does
not fill 16 threads: ncnn splits its Gemms into row tiles per thread, and its other layers
(attention, LayerNorm, the per-call dispatch) do not shrink with threads (the device's Xeon read
the int8 window layer at 50 ms on 4 threads and 53 ms on 16). The windows do not depend on each
other, so the calls run concurrently instead, each on its share of the threads, on one
``ncnn.Net`` (ncnn's extractors of one net may run on different threads; its Python binding lets
go of the GIL while extracting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class CallSplit:
    """Up to ``workers`` calls at a time, each extracting on ``threads_each`` threads."""

    workers: int
    threads_each: int


def split_threads(threads: int, concurrent_calls: int) -> CallSplit:
    """The thread budget of a graph whose spec allows ``concurrent_calls`` calls side by side.

    Fixed when the graph is opened, not per batch: ncnn's x86 Gemm packs its constant weights
    in tiles chosen for the load-time thread count and runs every later call on that many
    threads whatever the extractor asks (gemm_x86.cpp: "gemm will use load-time value"), so a
    net loaded for 16 threads and called 4 times at once would run 64. Each call gets
    ``ceil(threads / concurrent_calls)`` threads and as many calls run at once as that leaves
    room for; threads that do not divide evenly stay idle rather than go to some calls (the
    batch ends with its slowest call)."""
    if threads < 1 or concurrent_calls < 1:
        raise ValueError(f"split_threads: threads={threads}, concurrent_calls={concurrent_calls}")
    each = -(-threads // concurrent_calls)
    return CallSplit(threads // each, each)


def run_each(runner: Any, calls: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    """Every call's outputs, in call order: concurrently where the runner can (``NcnnModule.run_each``),
    one after another on any other runner (torch, recorders: they see the calls in order)."""
    each = getattr(runner, "run_each", None)
    return each(calls) if each is not None else [runner.run(c) for c in calls]
