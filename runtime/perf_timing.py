"""The one timing loop of the speed tables: runtimes timed call by call in alternation, and their
speed ratio as the median of per-round ratios with a distribution-free confidence interval.

Why interleaved: a shared machine's load changes from second to second. Timed in two blocks
(all torch calls, then all ncnn calls), a load that starts between the blocks slows only one
runtime and moves the ratio (a loaded run read 0.73x where a quiet one read 1.0x). Timed A, B,
A, B, ... each round's two calls see nearly the same load, so the per-round ratio cancels it and
the median over rounds is robust to the rounds where it did not. The order inside a round
changes so no runtime always runs right after the other (cache and frequency after-effects), and
so every pair runs in each order in half the rounds (``round_order``): the median of per-round
ratios then cancels a drift through the round instead of keeping part of it.

The interval is the order-statistic interval for a median (Hahn & Meeker): with n independent
per-round ratios, the number below the true median is Binomial(n, 1/2), so ranks ``k`` and
``n + 1 - k`` bound it with a probability computable exactly, no bootstrap and no normality.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

Call = Callable[[], Any]


def timed_ms(call: Call) -> tuple[float, Any]:
    """Milliseconds of one call and its result."""
    t = time.perf_counter()
    result = call()
    return (time.perf_counter() - t) * 1e3, result


def round_order(n: int, r: int) -> list[int]:
    """The order of ``n`` callables in round ``r``: rounds come in pairs, a rotation starting at
    callable ``(r // 2) % n`` and then the same rotation reversed. Why not a plain rotation (round
    ``r`` starting at ``r % n``, the rule before 2026-12-05): over ``n`` rotations callable ``i``
    runs before ``i + d`` in ``n - d`` of them, so neighbours in the list (torch and ncnn at one
    size, ncnn and ONNX Runtime) kept one order in all but one round of ``n``, and a drift through
    the round stayed in their ratio. A reversal flips every pair, so after each pair of rounds
    every two callables have run in both orders once, for any ``n``; over ``2 n`` rounds every
    callable also takes every position twice."""
    if n < 1 or r < 0:
        raise ValueError(f"round {r} of {n} callables")
    start = (r // 2) % n
    order = [(start + j) % n for j in range(n)]
    return order[::-1] if r % 2 else order


def interleaved_ms(calls: Sequence[Call], runs: int, warmup: int = 0) -> list[list[float]]:
    """``runs`` rounds, each calling every callable once in ``round_order``; ``times[i][r]`` is
    callable ``i`` in round ``r`` (ms). ``warmup`` untimed rounds come first. A single callable
    is the plain repeated-call loop."""
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    n = len(calls)
    for _ in range(warmup):
        for call in calls:
            call()
    times: list[list[float]] = [[0.0] * runs for _ in calls]
    for r in range(runs):
        for i in round_order(n, r):
            times[i][r] = timed_ms(calls[i])[0]
    return times


def rounds_first(n: int, runs: int, first: int, second: int) -> int:
    """In how many of ``runs`` rounds of ``round_order`` over ``n`` callables (``interleaved_ms``'s
    runtimes, or bench-cpp's cases) callable ``first`` ran before callable ``second``: half of
    them for an even ``runs``. Why the reports print it: under a drift through the run (a machine
    warming up, a load building) the later call of a pair reads slower, and the median of
    per-round ratios cancels that only where each ran first in as many rounds as the other, which
    an odd number of rounds cannot give."""
    if not (0 <= first < n and 0 <= second < n) or first == second:
        raise ValueError(f"callables {first} and {second} of {n}: two different ones needed")
    return sum(1 for r in range(runs) if (order := round_order(n, r)).index(first) < order.index(second))


def order_text(what: str, first: int, rounds: int, remedy: str = "") -> str:
    """The reports' words for ``rounds_first``: how often ``what`` ran first, and, where that is
    not half the rounds, that a drift through the run can then move the median of per-round
    ratios by up to one round's drift (``remedy``: how this report's user balances them)."""
    text = f"{what} ran first in {first} of {rounds} rounds"
    if 2 * first == rounds:
        return text
    return text + (" (unbalanced: a machine speeding up or slowing down through the run can move the median "
                   "by up to one round's drift" + (f"; {remedy}" if remedy else "") + ")")


def median_ms(call: Call, runs: int, warmup: int = 3) -> float:
    """Median of ``runs`` timed calls after ``warmup`` untimed ones."""
    return statistics.median(interleaved_ms([call], runs, warmup)[0])


def median_rank_interval(n: int, confidence: float = 0.95) -> tuple[int, int, float]:
    """1-based ranks ``(k, n + 1 - k)`` of the sorted sample bounding its median with at least
    ``confidence`` (the largest such ``k``), and the exact coverage. Below 6 samples no pair of
    ranks reaches 95 %: the interval is then the whole range, with its smaller coverage."""
    if n < 1:
        raise ValueError("no samples")

    def below(m: int) -> float:  # P(Binomial(n, 1/2) <= m)
        return sum(math.comb(n, j) for j in range(m + 1)) / 2 ** n

    k = 1
    while k + 1 <= (n + 1) // 2 and below(k) <= (1.0 - confidence) / 2:
        k += 1
    return k, n + 1 - k, 1.0 - 2 * below(k - 1)


@dataclass(frozen=True)
class RatioEstimate:
    """Median of per-round ratios ``numerator / denominator`` and its order-statistic interval."""

    median: float
    low: float
    high: float
    rounds: int
    coverage: float

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self) -> str:
        return f"{self.median:.2f}x [{self.low:.2f}, {self.high:.2f}]"

    def to_json(self) -> dict[str, float]:
        return {"median": self.median, "ci_low": self.low, "ci_high": self.high, "rounds": self.rounds,
                "ci_coverage": self.coverage}


def ratio_estimate(numerator_ms: Sequence[float], denominator_ms: Sequence[float],
                   confidence: float = 0.95) -> RatioEstimate:
    """Per-round ratios of two interleaved series (same rounds), their median and interval."""
    if len(numerator_ms) != len(denominator_ms):
        raise ValueError(f"{len(numerator_ms)} vs {len(denominator_ms)} rounds: ratios need the same rounds")
    ratios = sorted(a / b for a, b in zip(numerator_ms, denominator_ms))
    lo, hi, coverage = median_rank_interval(len(ratios), confidence)
    return RatioEstimate(statistics.median(ratios), ratios[lo - 1], ratios[hi - 1], len(ratios), coverage)
