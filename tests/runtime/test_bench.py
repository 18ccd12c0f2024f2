"""The stability checks can fail: doubles that leak, slow down or share state are caught."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ncnnport.runtime.bench import interleave, measure, relative_drift, robust_slope


class GrowingCacheDouble:
    """A 'session' that keeps every input it saw (a per-op cache never cleared) and scans it."""

    def __init__(self) -> None:
        self.kept: list = []

    def __call__(self):
        import mmap
        page = mmap.mmap(-1, 1 << 20)   # fresh pages every call: malloc cannot recycle them
        page.write(b"\x01" * (1 << 20))
        self.kept.append(page)  # 1 MiB per call
        t = time.perf_counter()
        while time.perf_counter() - t < 2e-5 * len(self.kept):  # work grows with the cache
            pass
        return [np.zeros(4, np.float32)]


class SharedLengthDouble:
    """The MNN bug: an encoder reading the LLM's KV length from shared metadata."""

    def __init__(self) -> None:
        self.shared = {"kv_len": 0}

    def encoder(self):
        return [np.full(4, self.shared["kv_len"] % 7, np.float32)]

    def decode_step(self):
        self.shared["kv_len"] += 1
        return [np.ones(4, np.float32)]


def steady():
    t = time.perf_counter()
    while time.perf_counter() - t < 2e-4:
        pass
    return [np.arange(4, dtype=np.float32)]


def test_steady_call_passes_every_check():
    """Judged by the verdict (aged vs fresh session), which other processes on the machine do
    not move; the time-series trend of ``measure`` is information only (it read -47 %/100 for
    a steady double at load 8-12)."""
    r = measure("steady", steady, warmup=2, runs=60)
    assert r.identical_outputs and abs(r.rss_growth_mb) < 2
    v = interleave({"steady": steady}, rounds=60, warmup=2, fresh={"steady": lambda: steady})["steady"]
    assert v.identical_outputs and not v.slowed_down(2.0), (v.aged_vs_fresh_low, v.aged_limit(2.0))


def test_growing_cache_is_flagged_for_drift_and_memory():
    """Judged against a fresh session (the time-series trend of ``measure`` read -47 %/100 for
    this double on this machine at load 8-11, where other processes came and went)."""
    r = interleave({"leaky": GrowingCacheDouble()}, rounds=60, warmup=2,
                   fresh={"leaky": GrowingCacheDouble})["leaky"]
    assert r.slowed_down(2.0), (r.aged_vs_fresh_low, r.aged_limit(2.0))
    assert r.rss_growth_mb > 30
    assert measure("leaky", GrowingCacheDouble(), warmup=2, runs=60).rss_growth_mb > 30


def test_shared_state_between_submodels_breaks_identity():
    d = SharedLengthDouble()
    res = interleave({"encoder": d.encoder, "decode": d.decode_step}, rounds=20, warmup=1)
    assert not res["encoder"].identical_outputs
    assert res["decode"].identical_outputs


def test_nondeterministic_output_is_flagged():
    rng = np.random.default_rng(0)
    r = measure("noisy", lambda: [rng.standard_normal(3)], warmup=1, runs=5)
    assert not r.identical_outputs and r.mismatched_calls


def test_robust_slope_ignores_one_spike_but_sees_a_trend():
    flat = [1.0] * 50
    flat[20] = 10.0
    assert abs(robust_slope(flat)[0]) < 1e-9
    trend = [1.0 + 0.01 * i for i in range(50)]
    slope, ci = robust_slope(trend)
    assert abs(slope - 0.01) < 1e-9 and slope - ci > 0


# --- drift judged against an interleaved control workload -------------------------------------

LOAD_SCRIPT = """
import multiprocessing, sys, time
def spin(stop):
    while time.time() < stop:
        pass
if __name__ == "__main__":
    period_s, workers, bound_s = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    end = time.time() + bound_s
    while time.time() < end:  # off for a period, then every core busy for a period, and again
        time.sleep(period_s)
        stop = min(time.time() + period_s, end)
        procs = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
"""


class LoadGenerator:
    """Other processes starting and stopping during the run: ``period_s`` quiet, then two busy
    loops per core for ``period_s``, repeated for at most ``bound_s``; killed on exit."""

    def __init__(self, period_s: float = 1.0, bound_s: float = 20.0) -> None:
        self.args = [str(period_s), str(2 * len(os.sched_getaffinity(0))), str(bound_s)]

    def __enter__(self) -> "LoadGenerator":
        # its own process group (to kill it whole) but this session: a new session would be its
        # own scheduler autogroup, whose busy loops together get one process's share of the CPU
        self.proc = subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, *self.args], process_group=0)
        return self

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def cpu_work(iterations: int):
    """A stage whose cost is CPU work (not wall time), so load slows it like a real graph."""
    def call():
        acc = 0
        for i in range(iterations):
            acc += i
        return [np.arange(4, dtype=np.float32)]
    return call


class SlowingStage:
    """A stage that does 1% more CPU work every call (a cache scanned as it grows). CPU work, not
    a sleep: a sleep is not slowed by load while the control is, which is not how a graph behaves."""

    def __init__(self, iterations: int) -> None:
        self.iterations, self.calls = iterations, 0

    def __call__(self):
        out = cpu_work(int(self.iterations * 1.01 ** self.calls))()
        self.calls += 1
        return out


def load_period_s(call, calls: int, periods: float) -> float:
    """A LoadGenerator period that splits a run of `calls` calls like `call` into about `periods`
    quiet / busy periods on this machine. Why measured: with a fixed 1 s period a fast host (a
    2-core Xeon ran 240 calls of cpu_work(150_000) in 0.8 s) finished the run inside the first
    quiet second, so the load these tests are about never came."""
    t0 = time.perf_counter()
    for _ in range(5):
        call()
    return max(0.05, (time.perf_counter() - t0) / 5 * calls / periods)


def block_medians(times: list, block: int = 5) -> list:
    return [float(np.median(times[k:k + block])) for k in range(0, len(times) - block + 1, block)]


def test_load_starting_and_stopping_passes_the_stability_verdict():
    # 120 rounds of an aged and a fresh call: about six quiet / busy periods over the run
    with LoadGenerator(period_s=load_period_s(cpu_work(150_000), 2 * 122, periods=6)):
        r = interleave({"stage": cpu_work(150_000)}, rounds=120, warmup=2,
                       fresh={"stage": lambda: cpu_work(150_000)})["stage"]
    blocks = block_medians(r.times_ms)
    # the load really came and went on the stage's wall time (else this test would prove nothing)
    assert max(blocks) > 1.5 * min(blocks), blocks
    assert not r.slowed_down(2.0), (r.aged_vs_fresh_low, r.aged_limit(2.0))


def test_one_percent_per_call_slowdown_fails_relative_drift_under_load():
    with LoadGenerator(period_s=1.0):
        r = interleave({"stage": SlowingStage(150_000)}, rounds=120, warmup=1)["stage"]
    assert not r.relative_drift_within(2.0), (r.relative_drift_pct_per_100, r.relative_drift_ci_pct_per_100)
    assert r.relative_drift_pct_per_100 > 30  # 1%/call compounding: ~100%/100 calls of the median
    assert r.slowed_down(2.0), (r.drift_pct_per_100, r.drift_ci_pct_per_100)  # the verdict fails it


def _result(raw: tuple[float, float], rel: tuple[float, float] | None):
    from ncnnport.runtime.bench import BenchResult

    return BenchResult("s", 100, 1.0, 1.0, 0.1, 1.0, 0.9, 1.1, raw[0], raw[1], 0.0, True,
                       relative_drift_pct_per_100=None if rel is None else rel[0],
                       relative_drift_ci_pct_per_100=None if rel is None else rel[1])


def test_a_control_that_drifts_alone_is_load_not_a_slowdown():
    """Measured in a nightly under load 6-8: the stage's own time fell (raw -18+-32 %/100) while
    the numpy control sped up more (ratio +74+-35): no slowdown. A stage slower in both passes
    neither the raw nor the relative gate."""
    from ncnnport.nightly import drift_exceeds

    load = _result((-18.5, 31.6), (73.7, 35.3))
    assert not load.slowed_down(2.0) and not drift_exceeds(load.to_json())
    slow = _result((60.0, 20.0), (70.0, 28.0))
    assert slow.slowed_down(2.0) and drift_exceeds(slow.to_json())
    raw_only = _result((45.0, 22.0), (12.0, 31.0))  # load came and went: the control moved too
    assert not raw_only.slowed_down(2.0) and not drift_exceeds(raw_only.to_json())
    assert _result((60.0, 20.0), None).slowed_down(2.0)  # no control ran: the raw verdict alone


def test_relative_drift_needs_bracketing_controls():
    with pytest.raises(ValueError, match="bracketing control"):
        relative_drift([1.0, 1.0], [1.0, 1.0])
    # a machine that halves its speed halfway: stage and control both double -> no drift
    stage = [2.0] * 40 + [4.0] * 40
    control = [1.0] * 41 + [2.0] * 40
    slope, _ = relative_drift(stage, control)
    assert abs(slope) < 1e-9


def _sen_interval(ys):
    """Sen (1968) by hand: the median pairwise slope and the slopes of ranks M1 and M2 + 1
    (1-based), M1,2 = (N -+ 1.96 sqrt(Var)) / 2 rounded, Var with the tie correction for
    repeated values."""
    from collections import Counter

    n = len(ys)
    slopes = sorted((ys[j] - ys[i]) / (j - i) for i in range(n) for j in range(i + 1, n))
    var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in Counter(ys).values() if t > 1)) / 18
    big_n = len(slopes)
    m1 = round((big_n - 1.959963984540054 * var ** 0.5) / 2)
    m2 = round((big_n + 1.959963984540054 * var ** 0.5) / 2)
    mid = (slopes[(big_n - 1) // 2] + slopes[big_n // 2]) / 2
    return mid, slopes[m1 - 1], slopes[m2]


def test_robust_slope_is_sens_interval_on_known_data():
    """Quantised timings (ties) with a spike: slope and the 95% interval are Sen's, computed by
    hand (the earlier hand-written interval ignored ties and rounded ranks outwards: 0.048
    instead of 0.038 here)."""
    ys = [9.6, 9.8, 10.1, 10.1, 10.3, 10.4, 14.0, 10.3, 10.5, 10.9, 10.8, 10.9]
    slope, lo, hi = _sen_interval(ys)
    got, ci = robust_slope(ys)
    assert got == pytest.approx(slope, abs=1e-12)
    assert ci == pytest.approx(max(slope - lo, hi - slope), abs=1e-12)
    assert slope - ci > 0  # a steady ~0.1 ms/call rise is seen through the spike


def test_load_that_rises_during_the_run_is_not_a_slowdown_of_a_session():
    """The false alarm of the time-series gates: the machine gets busier during the run (here
    the load generator starts after the first third), so later calls are slower in wall time.
    A fresh session timed in pairs with the aged one is slowed alike: ratio ~1, verdict passes."""
    calls = {"stage": cpu_work(150_000)}
    fresh = {"stage": lambda: cpu_work(150_000)}
    # the first quiet period a third of the run, then load
    with LoadGenerator(period_s=load_period_s(calls["stage"], 2 * 92, periods=3)):
        r = interleave(calls, rounds=90, warmup=2, fresh=fresh)["stage"]
    blocks = block_medians(r.times_ms)
    # the load really rose on the stage's wall time (without it the verdict below proves nothing)
    assert max(blocks) > 1.5 * min(blocks), blocks
    assert r.aged_vs_fresh_ratio is not None and 0.8 < r.aged_vs_fresh_ratio < 1.25, r.aged_vs_fresh_ratio
    assert r.aged_slower_than_fresh(2.0) is False
    assert not r.slowed_down(2.0)
    assert r.first_call_ms > 0  # the isolated first call is timed, not NaN


def test_one_percent_per_call_slowdown_fails_the_aged_vs_fresh_gate_under_load():
    fresh = {"stage": lambda: SlowingStage(150_000)}
    with LoadGenerator(period_s=1.0):
        r = interleave({"stage": SlowingStage(150_000)}, rounds=100, warmup=1, fresh=fresh)["stage"]
    # 1%/call compounding over ~104 calls: the aged session does ~2.8x the fresh one's work
    assert r.aged_vs_fresh_low > 2.0, (r.aged_vs_fresh_low, r.aged_vs_fresh_ratio)
    assert r.aged_slower_than_fresh(2.0) and r.slowed_down(2.0)
    from ncnnport.nightly import drift_exceeds
    assert drift_exceeds(r.to_json())


def test_a_fresh_session_that_answers_differently_is_shared_state():
    """A fresh session must give the isolated first call's outputs; the MNN-style shared counter
    makes the new encoder read the decode steps' length."""
    d = SharedLengthDouble()
    r = interleave({"enc": d.encoder, "dec": d.decode_step}, rounds=10, warmup=1, control=False,
                   fresh={"enc": lambda: d.encoder}, pairs=5)
    assert not r["enc"].identical_outputs


def test_median_interval_is_the_order_statistic_interval():
    from ncnnport.runtime.bench import _median_interval

    med, lo, hi = _median_interval(list(range(41)))
    assert (med, lo, hi) == (20.0, 13, 27)  # ranks 14 and 28 of 41 (binomial, 95%)
    assert _median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)  # too few: the range
