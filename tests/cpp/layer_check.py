"""Running one of the layer checks (runtime/cpp/tools/*_check.cpp: an overwrite against ncnn's
built-in layer), shared by the gemv, MatMul and int8 Gemm tests."""

from __future__ import annotations

import json
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


# gemv_prefetch.h's sequential sign test: on at >= 7 wins of 8 pairs, off at <= 4; otherwise 8 more
# pairs and on at >= 13 wins of 16.
PREFETCH_CALLS_TO_DECIDE = 32  # one-row calls that always reach a decision (16 pairs)


def prefetch_state_expected(report: dict) -> str:
    """The state a prefetch choice must report for its samples and pairs won."""
    pairs, won = min(report["samples_on"], report["samples_off"]), report["pairs_won"]
    if pairs < 8 or 8 < pairs < 16 or (pairs == 8 and 4 < won < 7):
        return "undecided"
    if pairs == 8:
        return "on" if won >= 7 else "off"
    return "on" if won >= 13 else "off"


def assert_prefetch_decided(report: dict) -> None:
    """After PREFETCH_CALLS_TO_DECIDE sampled calls: 8 or 16 pairs, and the state the rule gives."""
    assert (report["samples_on"], report["samples_off"]) in ((8, 8), (16, 16)), report
    assert report["state"] == prefetch_state_expected(report) != "undecided", report
