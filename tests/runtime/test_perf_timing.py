"""The speed tables' one timing loop: interleaved rounds, per-round ratios and their interval.

The decisive test runs two busy loops of known relative cost (N and 2N iterations, no sleep)
while a load generator shares their CPU: the interleaved ratio's interval holds 2, while the
same work timed in two blocks, with the load arriving between them, reads far from 2.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import pytest

from ncnnport.runtime.perf_timing import (interleaved_ms, median_ms, median_rank_interval, ratio_estimate,
                                         round_order, rounds_first)


def busy(n: int) -> int:
    """Pure-Python work proportional to ``n`` (no sleep: it needs the CPU the whole time)."""
    x = 0
    for i in range(n):
        x += i
    return x


def test_rounds_pair_a_rotation_with_its_reverse_so_no_runtime_always_goes_first() -> None:
    seen: list[str] = []
    calls = [lambda: seen.append("a"), lambda: seen.append("b"), lambda: seen.append("c")]
    times = interleaved_ms(calls, runs=4, warmup=1)
    assert seen == list("abc" "abc" "cba" "bca" "acb")  # warm-up, then rotations and their reverses
    assert [len(t) for t in times] == [4, 4, 4]
    with pytest.raises(ValueError):
        round_order(0, 1)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_every_pair_runs_in_each_order_in_every_two_rounds(n: int) -> None:
    """The property the reports rely on: after any even number of rounds each two callables ran
    in each order equally often, and after 2 n rounds every callable took every position twice."""
    for runs in range(2, 4 * n + 1, 2):
        for a in range(n):
            for b in range(n):
                if a != b:
                    assert 2 * rounds_first(n, runs, a, b) == runs, (n, runs, a, b)
    for i in range(n):
        positions = sorted(round_order(n, r).index(i) for r in range(2 * n))
        assert positions == sorted(2 * list(range(n))), (n, i)
    for r in range(4 * n):
        assert sorted(round_order(n, r)) == list(range(n))


def test_a_drift_through_the_round_stays_out_of_the_ratio_of_neighbours(monkeypatch) -> None:
    """Three runtimes on a machine slowing 5 % per call, the second truly twice the first. The
    plain rotation (round r starting at r % 3) ran the first before the second in 2 of 3 rounds,
    so the median of per-round ratios kept the drift: 2 x 1.05 = 2.10. Paired with its reverse,
    the per-round ratios are 2 x 1.05^(+-d), symmetric, and the median is 2 within 0.2 %."""
    from types import SimpleNamespace

    from ncnnport.runtime import perf_timing

    now = [0.0]
    done = [0]

    def cost(ms: float):
        def call() -> None:
            now[0] += ms * 1.05 ** done[0] / 1e3
            done[0] += 1
        return call

    monkeypatch.setattr(perf_timing, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    times = interleaved_ms([cost(1.0), cost(2.0), cost(1.0)], runs=12)
    est = ratio_estimate(times[1], times[0])
    assert est.median == pytest.approx(2.0, rel=2e-3) and est.contains(2.0)
    rotation = [[(r + j) % 3 for j in range(3)] for r in range(12)]  # the rule before, on the same drift
    old = [2.0 * 1.05 ** (seq.index(1) - seq.index(0)) for seq in rotation]
    assert statistics.median(old) == pytest.approx(2.1)


@pytest.mark.parametrize("n, runs", [(2, 3), (2, 4), (3, 5), (4, 20), (6, 20), (6, 6)])
def test_rounds_first_counts_what_the_loop_ran(n: int, runs: int) -> None:
    """The count the reports print is read off the loop itself: for every pair of callables, the
    rounds in which the first ran before the second."""
    order: list[list[int]] = [[] for _ in range(runs)]
    round_of = iter(r for r in range(runs) for _ in range(n))
    calls = [lambda i=i: order[next(round_of)].append(i) for i in range(n)]
    interleaved_ms(calls, runs)
    for a in range(n):
        for b in range(n):
            if a != b:
                ran = sum(1 for seq in order if seq.index(a) < seq.index(b))
                assert rounds_first(n, runs, a, b) == ran
    assert rounds_first(2, 3, 1, 0) == 2 and rounds_first(2, 4, 1, 0) == 2  # odd rounds cannot balance two
    with pytest.raises(ValueError, match="two different"):
        rounds_first(2, 4, 1, 1)


def test_median_rank_interval_matches_the_binomial_tables() -> None:
    # n=20: ranks 6 and 15, coverage 1 - 2 P(Bin(20, 1/2) <= 5) = 0.9586
    assert median_rank_interval(20)[:2] == (6, 15)
    assert median_rank_interval(20)[2] == pytest.approx(0.95861, abs=1e-5)
    assert median_rank_interval(6) == (1, 6, pytest.approx(1 - 2 / 64))
    k, j, coverage = median_rank_interval(5)            # too few rounds for 95 %: the whole range
    assert (k, j) == (1, 5) and coverage < 0.95
    for n in (7, 31, 100, 401):
        k, j, coverage = median_rank_interval(n)
        assert coverage >= 0.95 and median_rank_interval(n, 0.5)[0] > k


def test_ratio_estimate_is_the_median_of_per_round_ratios() -> None:
    est = ratio_estimate([2.0, 4.0, 6.0, 8.0, 10.0, 12.0], [1.0, 2.0, 3.0, 4.0, 5.0, 7.0])
    assert est.median == pytest.approx(2.0) and est.low == pytest.approx(12 / 7) and est.high == 2.0
    with pytest.raises(ValueError, match="same rounds"):
        ratio_estimate([1.0], [1.0, 2.0])


@pytest.fixture
def one_cpu():
    """This process pinned to one CPU (restored afterwards), so a load generator pinned there too
    takes half of it whenever it runs."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    yield cpu
    os.sched_setaffinity(0, before)


LOADERS = 1   # a busy process beside the timed one: it gets about half of its CPU


def start_load(cpu: int, loaders: int = LOADERS) -> list[subprocess.Popen]:
    """``loaders`` busy-looping processes pinned to ``cpu``."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loaders)]
    for p in procs:
        os.sched_setaffinity(p.pid, {cpu})
    time.sleep(0.2)
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
        p.wait()


# A loaded call's wall time comes in whole scheduler periods, so the per-round ratios are
# quantized with a step of about (slice length / the call's CPU time), whatever the number of
# loaders. Measured on a 2-core Xeon, kernel 6.18 (EEVDF), medians of the loaded ratio:
#   3 loaders, N = 400_000 (b ~17 ms CPU): 2.33-2.36 in 10 of 10 runs (18 % off; CI failed it at 2.35)
#   1 loader,  N = 800_000 (b ~34 ms CPU): 1.86-2.01 in 8 runs (<= 7 % off), same wall time per test
# The budget below is 20 %: the measured 7 % with room for a kernel whose slices are twice as long.
# At 75_000 (~3 ms, one slice) a call either ran whole or waited whole slices (CI read a loaded
# interval of [1.16, 8.63]).
N = 800_000
LOADED_BUDGET = 0.20
# The block-timing demonstration loads b's block with 3 loaders (b gets about a quarter of the CPU,
# so a quiet a over a loaded b reads ~0.5, the truth 2): it still reads under its 1.4 when
# something outside the test also shares a's block as much as one loader would (~1.0). With one
# loader there, CI under pytest-xdist (the other worker on the same core) read 1.82.
BLOCK_LOADERS = 3


def test_interleaved_ratio_holds_the_true_ratio_under_a_load_that_block_timing_does_not(one_cpu) -> None:
    a, b = (lambda: busy(2 * N)), (lambda: busy(N))       # true ratio a/b = 2
    quiet = ratio_estimate(*interleaved_ms([a, b], runs=41, warmup=2))
    # within 15 % of the truth, or its interval holds it: on a machine that other processes
    # share ("quiet" is only this test's own load off), a longer call is preempted more often,
    # which moves the median a few % (read 2.1-2.3 at load 8-12 on 2 cores)
    assert quiet.contains(2.0) or abs(quiet.median / 2.0 - 1) < 0.15, quiet

    load = start_load(one_cpu)
    try:
        loaded = ratio_estimate(*interleaved_ms([a, b], runs=41, warmup=2))
    finally:
        stop_load(load)
    assert loaded.contains(2.0) or abs(loaded.median / 2.0 - 1) < LOADED_BUDGET, loaded

    # the old way: each runtime in its own block, the load arriving between the blocks
    a_ms = median_ms(a, runs=15)
    load = start_load(one_cpu, BLOCK_LOADERS)
    try:
        b_ms = median_ms(b, runs=15)
    finally:
        stop_load(load)
    # quiet a over loaded b: 2 / 4 = 0.5, i.e. 4x off, far outside the interleaved budget
    assert not loaded.contains(a_ms / b_ms) and a_ms / b_ms < 1.4, (a_ms / b_ms, loaded)
