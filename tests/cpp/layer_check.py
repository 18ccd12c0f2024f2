"""Running one of the layer checks (runtime/cpp/tools/*_check.cpp: an overwrite against ncnn's
built-in layer), shared by the gemv, MatMul and int8 Gemm tests."""

from __future__ import annotations

import json
import math
import subprocess

import pytest


def run_layer_check(argv: list[str], needs: str) -> dict:
    """The check's JSON; the test is skipped where the overwrite was not registered (the CPU
    lacks ``needs``), and a non-zero exit fails it with the check's stderr."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    if not out["registered"]:
        pytest.skip(f"this CPU lacks {needs}: the overwrite is not registered")
    return out


# gemv_prefetch.h: the first PREFETCH_WARMUP_CALLS calls of the sampled sizes run plain, unsampled;
# then the sequential sign test (on at >= 7 wins of 8 pairs, off at <= 4; otherwise 8 more pairs and on
# at >= 13 wins of 16); once decided, every recheck_every-th call starts one more pair (16, or more
# where the variant not chosen is slower by more: its calls then cost 1 % of the stream's time, at most
# one in 256), and from 16 pairs on the median speed ratio of the last 16 (prefetching / plain) sets
# the state after each: on at >= 1.03, off at <= 1, unchanged in between.
PREFETCH_WARMUP_CALLS = 48
PREFETCH_CALLS_TO_DECIDE = PREFETCH_WARMUP_CALLS + 32  # calls that always reach a first decision


def prefetch_state_expected(report: dict) -> str:
    """The state a prefetch choice may report for its first decision, pairs and pairs won: the first
    decision's state while no recheck ran, else what the last 16 pairs' median ratio gives (the
    state it reports where that is between the bounds)."""
    first, pairs, won = report["first"], min(report["samples_on"], report["samples_off"]), report["pairs_won"]
    ratio = report["recent_ratio"]
    if ratio > 0:
        gap = max(ratio, 1 / ratio) - 1.0
        assert report["recheck_every"] == min(max(math.ceil(gap / 0.01), 16), 256), report
    if first["state"] == "":
        assert pairs < 16 and not (pairs == 8 and (won <= 4 or won >= 7)), report
        return "undecided"
    assert first["pairs"] in (8, 16) and pairs >= first["pairs"], report
    rule = "on" if first["won"] >= (7 if first["pairs"] == 8 else 13) else "off"
    assert first["state"] == rule and (first["pairs"] == 16 or not 4 < first["won"] < 7), report
    if pairs == first["pairs"] or pairs < 16:
        assert report["switches"] == 0, report
        return first["state"]
    return "on" if ratio >= 1.03 else ("off" if ratio <= 1.0 else report["state"])


def assert_prefetch_decided(report: dict) -> None:
    """After PREFETCH_CALLS_TO_DECIDE + a few sampled-size calls: a first decision on 8 or 16 pairs,
    and the state the rule gives."""
    assert report["first"]["pairs"] in (8, 16), report
    assert report["state"] == prefetch_state_expected(report) != "undecided", report
