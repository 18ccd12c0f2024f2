"""Repeated-call stability measurements: latency drift, RSS growth and output identity.

A runtime must not get slower, grow, or change its answer with the number of calls. Each check
here measures one of those on any callable returning arrays, so the same bench serves every
model stage (encoder, decode step, DiT block) and a user's own port.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import psutil

Call = Callable[[], Sequence[np.ndarray]]


def rss_bytes() -> int:
    """Resident set size of this process (psutil; 0 where the platform does not report it)."""
    try:
        return int(psutil.Process().memory_info().rss)
    except (psutil.Error, OSError):
        return 0


def robust_slope(ys: Sequence[float]) -> tuple[float, float]:
    """Theil-Sen slope of ys vs call index and the half-width of its 95% confidence interval.

    A median of pairwise slopes, not least squares: one 4 ms scheduler hiccup on a shared
    2-core machine must not read as a trend, while a steady slowdown still does. The interval
    is Sen's (1968) rank interval as ``scipy.stats.theilslopes`` computes it (ties among the
    values shrink the rank variance); the half-width is the wider side, so the drift gates'
    "lower bound of the 95% interval" stays conservative for a skewed interval.
    """
    n = len(ys)
    if n < 3:
        return 0.0, float("inf")
    try:  # lazy: scipy serves benches and reports, never the runtime path
        from scipy.stats import theilslopes
    except ImportError as exc:
        raise RuntimeError("scipy is not installed; the bench drift gates need it: "
                           "pip install 'ncnnport[bench]'") from exc
    res = theilslopes(np.asarray(ys, dtype=np.float64), alpha=0.95)
    slope = float(res.slope)
    return slope, float(max(slope - res.low_slope, res.high_slope - slope))


def fingerprint(outputs: Sequence[np.ndarray]) -> bytes:
    return b"".join(np.ascontiguousarray(o).tobytes() + str(o.shape).encode() for o in outputs)


# Calls shorter than this get the fastest of 3 per side in ``aged_vs_fresh``: a call of a few
# scheduler slices (CFS: ~3-4 ms at load) is whole or preempted; a longer one averages over
# preemptions itself, and SeedVR2's 0.3 s VAE stages would triple the gate's cost for nothing.
SHORT_CALL_MS = 20.0


# Two sessions of one stage differ by where their buffers landed: fresh/fresh medians read
# 0.96-1.05 over 18 pairs of qwen3-asr sessions at load 11 here, and an aged session can sit a
# step above a fresh one without growing (device host: seedvr2 dit_block 1.024 [1.020, 1.034]
# after 104 calls, fresh/fresh up to 1.005). The noise floor is never taken below this.
PLACEMENT_FLOOR = 1.05


def aged_limit(aged_calls: int, fresh_vs_fresh_high: float | None, pct_per_100: float) -> float:
    """The aged/fresh time ratio a session may reach after ``aged_calls`` calls: the
    session-to-session noise floor (upper end of the fresh/fresh interval measured in the run,
    at least ``PLACEMENT_FLOOR``) times the allowed slowdown of ``pct_per_100`` per 100 calls.
    So over 100 rounds the gate resolves a slowdown of ~7 % (1%/call compounding reads 2.8x)."""
    floor = max(PLACEMENT_FLOOR, fresh_vs_fresh_high or 1.0)
    return floor * (1.0 + pct_per_100 / 100.0 * aged_calls / 100.0)


@dataclass
class BenchResult:
    label: str
    runs: int
    first_call_ms: float
    mean_ms: float
    std_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    drift_pct_per_100: float
    drift_ci_pct_per_100: float
    rss_growth_mb: float
    identical_outputs: bool
    mismatched_calls: list[int] = field(default_factory=list)
    times_ms: list[float] = field(default_factory=list)
    # drift of stage/control time ratios (see ``relative_drift``); None when no control ran
    relative_drift_pct_per_100: float | None = None
    relative_drift_ci_pct_per_100: float | None = None
    control_median_ms: float | None = None
    # this session after its calls against a fresh session of the same stage, timed in
    # alternating pairs (see ``aged_vs_fresh``); None when no fresh session was compared
    aged_calls: int | None = None
    aged_vs_fresh_ratio: float | None = None
    aged_vs_fresh_low: float | None = None
    aged_vs_fresh_high: float | None = None
    # two fresh sessions of the stage timed the same way: how far sessions differ by placement
    # alone (buffer addresses, cache sets), the noise floor the aged/fresh ratio is judged above
    fresh_vs_fresh_ratio: float | None = None
    fresh_vs_fresh_high: float | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def drift_within(self, pct_per_100: float) -> bool:
        """Drift is acceptable when the slope's confidence interval does not exclude ``pct``.

        Judged on the lower CI bound so noise alone never fails the gate, while a real slowdown
        (like 702 ms -> 1848 ms over 15 calls) does.
        """
        return self.drift_pct_per_100 - self.drift_ci_pct_per_100 <= pct_per_100

    def relative_drift_within(self, pct_per_100: float) -> bool:
        """The same judgement on the stage/control ratio, which load on the machine cancels out
        of; falls back to the raw drift when no control workload ran."""
        if self.relative_drift_pct_per_100 is None or self.relative_drift_ci_pct_per_100 is None:
            return self.drift_within(pct_per_100)
        return self.relative_drift_pct_per_100 - self.relative_drift_ci_pct_per_100 <= pct_per_100

    def aged_slower_than_fresh(self, pct_per_100: float) -> bool | None:
        """Whether this session, after ``aged_calls`` calls, is slower than a fresh session of the
        same stage by more than two fresh sessions differ (upper end of their interval, measured
        in the same run: sessions differ by a few % by where their buffers landed, measured up to
        1.035 [1.017, 1.056] on qwen3-asr's decode at load 11) times ``pct_per_100`` per 100
        calls; judged on the lower end of the aged/fresh 95% interval. None when no fresh
        session was compared."""
        if self.aged_vs_fresh_low is None or self.aged_calls is None:
            return None
        return self.aged_vs_fresh_low > self.aged_limit(pct_per_100)

    def aged_limit(self, pct_per_100: float) -> float:
        return aged_limit(self.aged_calls or 0, self.fresh_vs_fresh_high, pct_per_100)

    def slowed_down(self, pct_per_100: float) -> bool:
        """The stability verdict. With a fresh session compared, that comparison decides: both
        sessions run the same code on the same machine within microseconds of each other, so load
        slows both alike and their ratio moves only when calls made the aged one slower. The time
        series' trend (raw and against the control) stays in the record: it cannot tell a
        slowdown from load that changed during a run of 1-2 s (measured: qwen3-asr encoder raw
        +14.5+-9.9 %/100, relative +23.8+-14.7 on a quiet machine; 400 rounds of the same stages:
        +2.0+-4.9 and +5.7+-22.1).

        Without one, a slowdown of the stage itself raises its time both absolutely
        and against the interleaved control, so both lower bounds must exceed ``pct``. Either one
        alone is load: other processes starting and stopping move the raw time (the control moves
        with it), and a control that reacts to contention differently from the stage (numpy vs an
        ncnn graph, memory- vs compute-bound) moves the ratio while the stage's own time does not
        (measured under load 6-8 on 2 cores: youtu-vl decode raw -18+-32, ratio +74+-35 %/100)."""
        aged = self.aged_slower_than_fresh(pct_per_100)
        if aged is not None:
            return aged
        return not self.drift_within(pct_per_100) and not self.relative_drift_within(pct_per_100)


class ControlWorkload:
    """A fixed single-threaded CPU workload, calibrated once to the stage's CPU time.

    Run call by call between the stage's calls, it is slowed by whatever else the machine runs
    exactly as the stage is; the ratio stage/control then drifts only when the stage itself
    does. numpy element-wise ops on an L2-resident array: never multi-threaded, no allocation.
    """

    def __init__(self, target_ms: float, elements: int = 1 << 14) -> None:
        rng = np.random.default_rng(0)
        self._a = rng.random(elements, dtype=np.float32)
        self._b = np.empty_like(self._a)
        self.repeats = 1
        self.repeats = self._calibrate(max(target_ms, 0.05))

    def _once(self) -> None:
        for _ in range(self.repeats):
            np.multiply(self._a, 1.0001, out=self._b)
            np.sqrt(self._b, out=self._b)

    def _calibrate(self, target_ms: float) -> int:
        """Repeats for ``target_ms`` of CPU time (process time: what a busy machine does not
        inflate), from batches of >= 5 ms so timer resolution does not set it."""
        while True:
            t = time.process_time()
            self._once()
            spent_ms = (time.process_time() - t) * 1e3
            if spent_ms >= 5.0 or self.repeats >= 1 << 20:
                break
            self.repeats *= 2
        return max(1, round(target_ms * self.repeats / max(spent_ms, 1e-6)))

    def __call__(self) -> float:
        """Run once; the elapsed milliseconds."""
        t = time.perf_counter()
        self._once()
        return (time.perf_counter() - t) * 1e3


def relative_drift(stage_ms: Sequence[float], control_ms: Sequence[float],
                   block: int = 5) -> tuple[float, float]:
    """Drift of the stage/control ratio (% per 100 calls, and its 95% CI half-width).

    ``control_ms`` has one more entry than ``stage_ms``: controls i and i+1 bracket stage call i.
    Calls are grouped in blocks of ``block``; a block's ratio is the median of its stage calls
    over the median of its bracketing controls. On a machine shared with other processes a
    millisecond call's wall time is quantised by the scheduler (it either got a time slice or
    waited for one), so single-call ratios are bimodal noise; block medians keep the machine's
    speed at that moment and drop the quantisation. The Theil-Sen slope runs over the blocks.
    """
    if len(control_ms) != len(stage_ms) + 1:
        raise ValueError(f"{len(stage_ms)} stage calls need {len(stage_ms) + 1} bracketing control calls")
    stage = np.asarray(stage_ms, dtype=np.float64)
    ctrl = np.asarray(control_ms, dtype=np.float64)
    block = max(1, min(block, len(stage) // 8 or 1))  # keep >= 8 points for the slope when short
    starts = range(0, len(stage) - block + 1, block)
    ratio = [float(np.median(stage[k:k + block]) / max(float(np.median(ctrl[k:k + block + 1])), 1e-9))
             for k in starts]
    slope, ci = robust_slope(ratio)
    med = float(np.median(ratio)) if ratio else 0.0
    if med <= 0:
        return 0.0, float("inf")
    return 100.0 * slope / block * 100.0 / med, 100.0 * ci / block * 100.0 / med


def _median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The median of ``values`` and its distribution-free confidence interval from order
    statistics (the binomial(n, 1/2) ranks), valid for any continuous distribution of independent
    values: scheduler noise on a shared machine is neither normal nor symmetric."""
    from scipy.stats import binom

    xs = sorted(values)
    n = len(xs)
    alpha = 1.0 - confidence
    j = 1  # the largest j with P(Bin(n, 1/2) <= j - 1) <= alpha / 2: [x_(j), x_(n+1-j)] covers
    while j < n // 2 and binom.cdf(j, n, 0.5) <= alpha / 2:
        j += 1
    k = j - 1 if binom.cdf(j - 1, n, 0.5) <= alpha / 2 else 0  # 0-based rank; too few values: the range
    return float(np.median(xs)), xs[k], xs[n - 1 - k]


def aged_vs_fresh(aged: Call, fresh: Call, *, pairs: int = 41, per_side: int = 3,
                  warmup: int = 3) -> tuple[float, float, float]:
    """Time ``aged`` (a session after many calls) against ``fresh`` (a new session of the same
    stage) in ``pairs`` groups of ``per_side`` alternating calls each (A B A B A B, the first
    side alternating between groups); each group gives the ratio of the two sides' fastest
    calls. Returns the median group ratio aged/fresh and its 95% interval.

    Why: the calls of a group run microseconds apart, so whatever else the machine does slows
    both sessions alike, where a trend over the run's time series cannot tell calls from load.
    The fastest of a few calls, because on a busy machine a millisecond call either got a time
    slice or waited for one: waiting only adds time, a slowdown of the session raises every
    call. ``fresh`` gets ``warmup`` calls first (first-call allocation is not a slowdown of the
    other)."""
    for _ in range(warmup):
        fresh()
    ratios = []
    for i in range(pairs):
        best = {"aged": float("inf"), "fresh": float("inf")}
        order = (("aged", aged), ("fresh", fresh)) if i % 2 == 0 else (("fresh", fresh), ("aged", aged))
        for _ in range(per_side):
            for name, fn in order:
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
        ratios.append(best["aged"] / max(best["fresh"], 1e-12))
    return _median_interval(ratios)


def measure(label: str, call: Call, *, warmup: int = 3, runs: int = 20,
            reference: Sequence[np.ndarray] | None = None) -> BenchResult:
    """Time ``call``: the first call alone, ``warmup`` more, then ``runs`` timed calls.

    Every output (warm-up included) is compared bitwise with ``reference`` (default: the first
    call's output); RSS is read after warm-up and after the timed runs.
    """
    t0 = time.perf_counter()
    first = [np.array(o, copy=True) for o in call()]
    first_ms = (time.perf_counter() - t0) * 1e3
    ref = fingerprint(reference if reference is not None else first)
    mismatched = [] if fingerprint(first) == ref else [0]
    for i in range(warmup):
        if fingerprint(call()) != ref:
            mismatched.append(1 + i)
    gc.collect()
    rss0 = rss_bytes()
    times = []
    for i in range(runs):
        t = time.perf_counter()
        out = call()
        times.append((time.perf_counter() - t) * 1e3)
        if fingerprint(out) != ref:
            mismatched.append(1 + warmup + i)
    gc.collect()
    rss1 = rss_bytes()
    med = statistics.median(times)
    slope, ci = robust_slope(times)
    return BenchResult(
        label=label, runs=runs, first_call_ms=first_ms, mean_ms=statistics.fmean(times),
        std_ms=statistics.pstdev(times), median_ms=med, min_ms=min(times), max_ms=max(times),
        drift_pct_per_100=100.0 * slope * 100.0 / med if med > 0 else 0.0,
        drift_ci_pct_per_100=100.0 * ci * 100.0 / med if med > 0 else 0.0,
        rss_growth_mb=(rss1 - rss0) / 2**20, identical_outputs=not mismatched,
        mismatched_calls=mismatched, times_ms=times)


def interleave(calls: dict[str, Call], *, rounds: int, warmup: int = 3,
               control: bool = True, fresh: Mapping[str, Callable[[], Call]] | None = None,
               pairs: int = 41) -> dict[str, BenchResult]:
    """Alternate the calls round-robin; each one's outputs must equal its isolated first call.

    This is the multimodal case: an encoder called between LLM decode steps must neither slow
    down nor change because the other sub-model ran. With ``control``, each stage call is
    bracketed by calls of its own :class:`ControlWorkload` (calibrated to the stage's warm-up
    time), and its drift is also judged on the stage/control ratio, which machine load cancels.
    With ``fresh`` (a factory of a new session per stage), each stage is finally timed against a
    fresh session of itself (:func:`aged_vs_fresh`), whose outputs must equal the isolated ones too.
    """
    isolated, first_ms = {}, {}
    for name, fn in calls.items():
        t = time.perf_counter()
        isolated[name] = [np.array(o, copy=True) for o in fn()]
        first_ms[name] = (time.perf_counter() - t) * 1e3
    refs = {name: fingerprint(out) for name, out in isolated.items()}
    warm_cpu_ms: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(max(warmup, 3 if control else 0)):
        for name, fn in calls.items():
            t = time.process_time()
            fn()
            warm_cpu_ms[name].append((time.process_time() - t) * 1e3)
    # calibrated in CPU time, which load does not inflate: a control of the stage's own length
    # spans as many scheduler time slices, so a busy machine stretches both alike
    controls = {n: ControlWorkload(statistics.median(ts)) for n, ts in warm_cpu_ms.items()} if control else {}
    ctrl_ms: dict[str, list[float]] = {n: [c()] for n, c in controls.items()}
    gc.collect()
    rss0 = rss_bytes()
    times: dict[str, list[float]] = {n: [] for n in calls}
    bad: dict[str, list[int]] = {n: [] for n in calls}
    for r in range(rounds):
        for name, fn in calls.items():
            t = time.perf_counter()
            out = fn()
            times[name].append((time.perf_counter() - t) * 1e3)
            if name in controls:
                ctrl_ms[name].append(controls[name]())
            if fingerprint(out) != refs[name]:
                bad[name].append(r)
    gc.collect()
    growth = (rss_bytes() - rss0) / 2**20
    aged: dict[str, tuple[float, float, float]] = {}
    null: dict[str, tuple[float, float, float]] = {}
    for name, make in (fresh or {}).items():
        new, other = make(), make()
        for session in (new, other):
            if fingerprint(session()) != refs[name]:
                bad[name].append(rounds)  # a fresh session must answer as the isolated first call did
        per_side = 3 if statistics.median(times[name]) < SHORT_CALL_MS else 1
        aged[name] = aged_vs_fresh(calls[name], new, pairs=pairs, per_side=per_side)
        null[name] = aged_vs_fresh(other, new, pairs=pairs, per_side=per_side, warmup=0)
    results = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        slope, ci = robust_slope(ts)
        rel = relative_drift(ts, ctrl_ms[name]) if name in ctrl_ms else (None, None)
        results[name] = BenchResult(
            label=name, runs=rounds, first_call_ms=first_ms[name], mean_ms=statistics.fmean(ts),
            std_ms=statistics.pstdev(ts), median_ms=med, min_ms=min(ts), max_ms=max(ts),
            drift_pct_per_100=100.0 * slope * 100.0 / med, drift_ci_pct_per_100=100.0 * ci * 100.0 / med,
            rss_growth_mb=growth, identical_outputs=not bad[name], mismatched_calls=bad[name], times_ms=ts,
            relative_drift_pct_per_100=rel[0], relative_drift_ci_pct_per_100=rel[1],
            control_median_ms=statistics.median(ctrl_ms[name]) if name in ctrl_ms else None,
            aged_calls=1 + max(warmup, 3 if control else 0) + rounds if name in aged else None,  # before the pairs
            aged_vs_fresh_ratio=aged[name][0] if name in aged else None,
            aged_vs_fresh_low=aged[name][1] if name in aged else None,
            aged_vs_fresh_high=aged[name][2] if name in aged else None,
            fresh_vs_fresh_ratio=null[name][0] if name in null else None,
            fresh_vs_fresh_high=null[name][2] if name in null else None)
    return results


def print_fidelity(model: str, stage: str, size: str, got: np.ndarray, ref: np.ndarray, tol: Any) -> bool:
    """One line: a reduced-precision bench stage's output against the fp32 graphs on the same
    inputs, judged by the policy's budget ``tol`` (a Tolerance), so a speed number never comes
    without the fidelity it was bought with. Returns whether it is within the budget."""
    from ncnnport.metrics import compare

    st = compare(ref, got)
    rel = st.max_abs / max(st.ref_absmax, 1e-30)
    ok = st.cosine >= tol.min_cosine and st.max_abs <= tol.max_abs_allowed(st.ref_absmax)
    top = "" if got.size < 1000 else f", top-1 {'same' if int(got.argmax()) == int(ref.argmax()) else 'DIFFERS'}"
    print(f"[{model}] {stage}@{size} vs fp32 graphs: cosine {st.cosine:.7f}, max_abs {st.max_abs:.2e} "
          f"(rel {rel:.2e}){top}; budget cosine >= {tol.min_cosine}, max_abs_rel <= {tol.max_abs_rel}: "
          f"{'within' if ok else 'OUTSIDE'}", flush=True)
    return ok
