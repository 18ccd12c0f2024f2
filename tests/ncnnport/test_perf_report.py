"""``bench --perf``: torch and ncnn interleaved call by call (a load change mid-table leaves the
ratio alone), thread scaling over ``--threads-list``, declared targets judged on the measured
rows, and every table headed by the machine.

The runtimes here are fakes on a virtual clock: a call advances ``time.perf_counter`` by its cost
times the current load factor, so the load can be switched at an exact call.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ncnnport.drivers import torch_ratio
from ncnnport.runtime.perf_targets import PerfTarget

X = np.ones(4, np.float32)


class Clock:
    """A virtual ``perf_counter`` (seconds); ``load`` multiplies every cost from call ``switch_at`` on."""

    def __init__(self, switch_at: int | None = None, load: float = 3.0) -> None:
        self.now, self.calls, self.switch_at, self.load = 0.0, 0, switch_at, load
        self.swept: list[int] = []  # the buffer sizes read_bandwidth swept

    def __call__(self) -> float:
        return self.now

    def work(self, ms: float) -> None:
        self.calls += 1
        slow = self.switch_at is not None and self.calls > self.switch_at
        self.now += ms * (self.load if slow else 1.0) / 1e3


class Port:
    """torch costs 2 ms, ncnn 1 ms / threads**0.5 (so 2 threads are 71 % efficient)."""

    def __init__(self, clock: Clock, targets: list[PerfTarget] | None = None) -> None:
        self.clock, self.targets = clock, targets or []

    def bench_stages(self) -> dict[str, list[str]]:
        return {"decode": ["100", "1000"]}

    def torch_bench_call(self, loaded, stage, size):
        return lambda: (self.clock.work(2.0), [X])[1]

    def bench_call(self, loaded, modules, stage, size):
        ms = 1.0 / modules["options"].num_threads ** 0.5
        return lambda: (self.clock.work(ms), [X])[1]

    def bench_bytes(self, loaded, stage, size, precision="fp32"):
        return {"weights": 8_000_000, "kv_cache": 0}   # 1 ms at 8 GB/s

    def bench_perf_targets(self) -> list[PerfTarget]:
        return self.targets


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    def read_bandwidth(n_bytes: int = 256 << 20) -> dict:
        c.swept.append(n_bytes)
        return {"array_mb": n_bytes / 2**20, "numpy_sum_gbps": 8.0, "read_gbps": 8.0, "copy_gbps": 5.0}
    monkeypatch.setattr(torch_ratio, "read_bandwidth", read_bandwidth)
    monkeypatch.setattr("ncnnport.runtime.lazy_modules.open_ncnn_modules",
                        lambda package, options: {"options": options})
    return c


def _prep(port: Port) -> SimpleNamespace:
    return SimpleNamespace(port=port, loaded=None, target=SimpleNamespace(model="toy"), specs=[])


def test_a_load_arriving_mid_table_does_not_move_the_ratio(clock) -> None:
    runs = 20
    # the load starts right after torch's warm-up and first half of its calls (block timing
    # would have torch quiet and ncnn loaded: 2 / 3 = 0.67x)
    clock.switch_at = torch_ratio.WARMUP * 2 + runs
    rows = torch_ratio.torch_ratio_table(_prep(Port(clock)), Path("p"), ["decode"], ["100"], 1, runs)
    (row,) = rows
    assert row["ratio"] == pytest.approx(2.0)
    assert row["ratio_ci"]["ci_low"] == pytest.approx(2.0) and row["ratio_ci"]["ci_high"] == pytest.approx(2.0)
    assert row["rounds"] == runs
    # the heading's read over the default buffer, the stage's bound over its own 8 MB of weights
    assert clock.swept == [256 << 20, 7 << 20] and row["bandwidth"]["array_mb"] == 7.0


def test_threads_list_reports_scaling_efficiency_and_targets_with_measured_values(clock, capsys) -> None:
    targets = [PerfTarget("decode >= 85 % of bound, P=100", "decode", "100", "ncnn_pct_of_bound", at_least=85,
                          weight_bytes=4),
               PerfTarget("decode flat: P=1000 / P=100", "decode", "1000", "ncnn_ms", at_most=1.1, over_size="100"),
               PerfTarget("fp16 only", "decode", "100", "ratio", at_least=1.0, weight_bytes=2),
               PerfTarget("rss", "decode", "100", "rss", at_most=1.5, unmeasured="needs its own process")]
    report = torch_ratio.perf_report(_prep(Port(clock, targets)), Path("p"), ["decode"], None, [1, 2], 5, peer=False)
    assert {r["threads"] for r in report["rows"]} == {1, 2}
    ncnn = next(s for s in report["scaling"] if s["runtime"] == "ncnn" and s["size"] == "100")
    assert ncnn["efficiency"]["1"] == pytest.approx(1.0)
    assert ncnn["efficiency"]["2"] == pytest.approx(1 / 2 ** 0.5)     # 1 ms -> 0.707 ms on 2 threads
    torch_eff = next(s for s in report["scaling"] if s["runtime"] == "torch" and s["size"] == "100")
    assert torch_eff["efficiency"]["2"] == pytest.approx(0.5)          # 2 ms on both counts
    verdicts = {(v["target"], v["threads"]): v for v in report["targets"]}
    assert not any(t == "fp16 only" for t, _ in verdicts)               # not this run's weight width
    at1 = verdicts[("decode >= 85 % of bound, P=100", 1)]
    assert at1["value"] == pytest.approx(100.0) and at1["met"] is True  # bound 1 ms, ncnn 1 ms
    at2 = verdicts[("decode >= 85 % of bound, P=100", 2)]
    assert at2["value"] == pytest.approx(100 * 2 ** 0.5) and at2["met"] is True
    assert verdicts[("decode flat: P=1000 / P=100", 1)]["value"] == pytest.approx(1.0)
    assert verdicts[("rss", 1)]["met"] is None
    out = capsys.readouterr().out
    assert "machine: " in out and "threads 2" in out and "read bandwidth 8.0 GB/s" in out and "OMP_WAIT_POLICY" in out
    assert "| decode >= 85 % of bound, P=100 | 1 | 100 | >= 85 | met |" in out
    assert "not measured: needs its own process" in out
    assert "Python ncnn wheel" in out and "make bench-cpp" in out  # which loop the verdicts judge
    assert "thread scaling" in out and "t2 0.71" in out


class SizedPort(Port):
    """ncnn's P=1000 call costs ``longer`` x its P=100 call; torch 2 ms at both."""

    longer = 1.05

    def bench_call(self, loaded, modules, stage, size):
        ms = 1.0 * (self.longer if size == "1000" else 1.0)
        return lambda: (self.clock.work(ms), [X])[1]


def test_a_load_arriving_between_the_sizes_does_not_move_the_flatness(clock, capsys) -> None:
    """Item 2's P=1000 / P=100 on a machine loaded 3x from the middle of the stage's calls on. One
    size after the other, P=1000's calls would all be loaded (3 x 1.05 = 3.15, not met), and even
    in one loop the ratio of the two medians reads the load (0.70); the per-round ratio is 1.05 in
    every round but the one the load arrives in, so the target reads 1.05 (met), with its interval."""
    runs = 20
    calls_per_round = 4  # torch and ncnn at each of two sizes
    clock.switch_at = torch_ratio.WARMUP * calls_per_round + calls_per_round * runs // 2
    target = PerfTarget("decode flat: P=1000 / P=100", "decode", "1000", "ncnn_ms", at_most=1.1, over_size="100")
    report = torch_ratio.perf_report(_prep(SizedPort(clock, [target])), Path("p"), ["decode"], None, [1], runs,
                                     peer=False)
    long = next(r for r in report["rows"] if r["size"] == "1000")
    est = long["over_size"]["100"]["ncnn_ms"]
    assert est["median"] == pytest.approx(1.05) and est["rounds"] == runs
    assert long["over_size"]["100"]["torch_ms"]["median"] == pytest.approx(1.0)
    (v,) = report["targets"]
    assert v["value"] == pytest.approx(1.05) and v["met"] is True
    assert v["note"].startswith(f"median of {runs} per-round ratios [")
    assert est["first"] == 10  # four calls a round, each rotation followed by its reverse: half the rounds
    assert ("| decode flat: P=1000 / P=100 | 1 | 1.05 (median of 20 per-round ratios [1.05, 1.05]; "
            "@1000 ran first in 10 of 20 rounds) | <= 1.1 | met |") in capsys.readouterr().out
    # the ratio of the two medians, the rule before, reads the load: the load's round leaves one
    # size a loaded call more than the other, and each median falls between a quiet and a loaded
    # call (here 2.1 / 3.0 = 0.70)
    short = next(r for r in report["rows"] if r["size"] == "100")
    assert abs(long["ncnn_ms"] / short["ncnn_ms"] - 1.05) > 0.3


class BytesPort(Port):
    """Reads ``mb`` MB a call, so torch's 2 ms sits at ``mb / 16`` of the 8 GB/s bound."""

    mb = 12

    def bench_bytes(self, loaded, stage, size, precision="fp32"):
        return {"weights": self.mb * 1_000_000, "kv_cache": 0}


@pytest.mark.parametrize("mb, needed, met", [(12, ">= 1.7", True), (4, ">= 3", False)])
def test_a_target_says_its_threshold_value_and_verdict(clock, mb, needed, met) -> None:
    # torch at 75 % of the bound saturates memory, so the 1.7x threshold applies (2.0x meets it);
    # at 25 % the 3x threshold does (2.0x misses it)
    targets = [PerfTarget("token vs torch", "decode", "100", "ratio", at_least=3.0, saturated_at_least=1.7)]
    port = BytesPort(clock, targets)
    port.mb = mb
    report = torch_ratio.perf_report(_prep(port), Path("p"), ["decode"], ["100"], [1], 5, peer=False)
    (v,) = report["targets"]
    assert v["value"] == pytest.approx(2.0) and v["needed"] == needed and v["met"] is met


def test_the_peer_column_says_why_it_is_empty(clock, capsys) -> None:
    report = torch_ratio.perf_report(_prep(Port(clock)), Path("p") / "package", ["decode"], ["100"], [1], 3)
    (row,) = report["rows"]
    assert row["ort_note"].startswith("no ONNX peer graphs") or "onnxruntime not installed" in row["ort_note"]
    assert row["ort_note"] in capsys.readouterr().out


def test_a_flatness_target_without_per_round_ratios_is_not_measured() -> None:
    """Rows whose sizes were not timed in one loop carry no ``over_size``: the target says so
    instead of dividing two medians (the rule that a load between the sizes moved)."""
    from ncnnport.runtime.perf_targets import judge_one

    target = PerfTarget("decode flat", "decode", "1000", "ncnn_ms", at_most=1.1, over_size="100")
    rows = [{"stage": "decode", "size": "100", "threads": 1, "ncnn_ms": 1.0},
            {"stage": "decode", "size": "1000", "threads": 1, "ncnn_ms": 1.05}]
    v = judge_one(target, rows, 1)
    assert v["met"] is None and v["value"] is None and "no per-round ncnn_ms ratio" in v["note"]
    rows[1]["over_size"] = {"100": {"ncnn_ms": {"median": 1.2, "ci_low": 1.1, "ci_high": 1.3, "rounds": 5}}}
    v = judge_one(target, rows, 1)
    assert v["value"] == pytest.approx(1.2) and v["met"] is False  # the per-round median, not 1.05
    rows[1]["over_size"]["100"]["ncnn_ms"]["first"] = 2  # 5 rounds: 2 and 3 cannot balance
    assert judge_one(target, rows, 1)["note"].endswith(
        "; @1000 ran first in 2 of 5 rounds (unbalanced: a machine speeding up or slowing down through the run "
        "can move the median by up to one round's drift)")


def test_the_speed_tables_default_rounds_balance_every_pair_and_position() -> None:
    """A stage's two sizes share one loop of 4 calls (torch, ncnn at each) or 6 (with the ONNX
    Runtime peer): with bench --perf's default rounds every two calls, the runtimes at one size
    (torch and ncnn, which the plain rotation ran in one order in 20 of 24 rounds) and one runtime
    at the two sizes, run in each order in half the rounds, and every call takes every position
    equally often."""
    from ncnnport.cli import build_parser, default_runs
    from ncnnport.runtime.perf_timing import round_order, rounds_first

    runs = default_runs(perf=True)
    for n in (4, 6):
        for a in range(n):
            for b in range(n):
                if a != b:
                    assert 2 * rounds_first(n, runs, a, b) == runs, (n, a, b, runs)
            assert sorted(round_order(n, r).index(a) for r in range(runs)) == sorted(runs // n * list(range(n)))
    assert build_parser().parse_args(["bench", "qwen3-asr"]).runs is None  # resolved by perf or not
    assert default_runs(perf=False) == 20  # the stability table keeps its calls


def test_bench_refuses_a_size_given_twice_in_one_line(capsys) -> None:
    from ncnnport.cli import main

    assert main(["bench", "qwen3-asr", "--perf", "--sizes", "100,100"]) == 2  # before any model loads
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "--sizes 100,100: give each size once" in err[0], err


def test_threads_list_option_parses_or_says_one_line() -> None:
    from argparse import Namespace

    from ncnnport.cli import _threads_list

    assert _threads_list(Namespace(threads=3, threads_list=None)) == [3]
    assert _threads_list(Namespace(threads=1, threads_list="1,4,16")) == [1, 4, 16]
    for bad in ("1,x", "0,2", ","):
        with pytest.raises(SystemExit, match="--threads-list .*positive integers"):
            _threads_list(Namespace(threads=1, threads_list=bad))


class HalfWeightsPort(Port):
    """ncnn under fp16 storage reads 4 MB a call; the fp32 runtimes read the fp32 8 MB."""

    def bench_bytes(self, loaded, stage, size, precision="fp32"):
        return {"weights": (8 if precision == "fp32" else 4) * 1_000_000, "kv_cache": 0}


def test_fp32_runtimes_are_judged_against_the_fp32_bound_in_a_reduced_precision_run(clock, monkeypatch) -> None:
    monkeypatch.setattr("ncnnport.drivers.bench.check_fidelity", lambda *a, **k: True)
    (row,) = torch_ratio.torch_ratio_table(_prep(HalfWeightsPort(clock)), Path("p"), ["decode"], ["100"], 1, 5,
                                           precision="fp16-storage")
    assert row["ncnn_pct_of_bound"] == pytest.approx(50.0)     # 0.5 ms bound at 2-byte weights, ncnn 1 ms
    assert row["torch_pct_of_bound"] == pytest.approx(50.0)    # 1 ms fp32 bound, torch 2 ms (not 25 %)


def test_a_stages_bound_sweeps_its_own_weight_bytes_and_the_fp32_runtimes_theirs(monkeypatch) -> None:
    """stage_bandwidths: one read over the stage's weight bytes (probe_bytes), a second over the
    fp32 bytes only where those round to another buffer, the default buffer where no bytes are
    counted."""
    swept: list[int] = []

    def read_bandwidth(n_bytes: int = 256 << 20) -> dict:
        swept.append(n_bytes)
        return {"read_gbps": 20.0 if n_bytes < 100 << 20 else 16.0}
    monkeypatch.setattr(torch_ratio, "read_bandwidth", read_bandwidth)
    bw, fp32 = torch_ratio.stage_bandwidths({"weights": 60_000_000}, {"weights": 120_000_000})
    assert swept == [57 << 20, 114 << 20] and (bw["read_gbps"], fp32["read_gbps"]) == (20.0, 16.0)
    swept.clear()
    bw, fp32 = torch_ratio.stage_bandwidths({"weights": 60_000_000}, None)
    assert swept == [57 << 20] and fp32 is bw
    swept.clear()
    bw, fp32 = torch_ratio.stage_bandwidths(None, None)
    assert swept == [256 << 20] and fp32 is bw
    row = torch_ratio.bound_row(10.0, {"weights": 60_000_000}, 20.0, {"torch": 20.0}, {"weights": 120_000_000}, 16.0)
    assert row["fp32_bound_weights_ms"] == pytest.approx(7.5) and row["torch_pct_of_bound"] == pytest.approx(37.5)
