"""ncnnport's InnerProduct overwrite (runtime/cpp/src/gemv_layer.cpp) against ncnn's built-in.

`ncnnport-gemv-check` (runtime/cpp/tools/gemv_check.cpp) loads one random InnerProduct twice,
with and without the overwrite, runs a sequence of calls and reports per call the largest
difference over the fp32 summation-order bound it derives (2 * gamma(K + 1) * (|b| + sum |w x|),
see the tool's header) and how many one-row products the overwrite computed itself. The
executables' JSON must say which InnerProduct ran and prove it by that count. Slow: they need
`make cpp` (and the executables a tiny package).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.cpp.layer_check import (PREFETCH_CALLS_TO_DECIDE, PREFETCH_WARMUP_CALLS, assert_prefetch_decided, prefetch_state_expected,
                                    run_layer_check)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
CHECK = BUILD / "ncnnport-gemv-check"

# (N, K): N and K off every multiple of 4 / 8 / 16 / 64 ncnn or the kernel packs by, exact
# multiples, fewer outputs than one block of 64, a last block of 8 and of 2, a wide layer, and an
# output past output_store.h's 128 KiB (written with streaming stores, its last block of 48 too)
SHAPES = [(1, 1), (5, 3), (37, 63), (36, 70), (64, 64), (72, 129), (130, 333), (1000, 1001), (2048, 1024),
          (65584, 40)]
WEIGHTS = {"fp32": [], "fp16-storage": ["--fp16-storage"], "fp16-bin": ["--fp16-bin"]}
# the kernel's copies: the default (16 lanes where the CPU has AVX-512F) and the 8-lane AVX2 one,
# which packs the narrow layout (16-output blocks) and reads them one at a time or 4 side by side
# (its default: the machine's choice)
ISAS = {"default": [], "avx2": ["--avx2"], "avx2-1-stream": ["--avx2", "--streams", "1"],
        "avx2-4-streams": ["--avx2", "--streams", "4"]}


@pytest.fixture(scope="module")
def check(built_cpp) -> Path:
    return built_cpp(CHECK, "NCNNPORT_CPP_BUILD")


def run_check(check: Path, n: int, k: int, *extra: str) -> dict:
    return run_layer_check([str(check), "--n", str(n), "--k", str(k), *extra], "AVX2 / FMA / F16C")


def assert_within_bound(out: dict, what: str) -> None:
    for i, call in enumerate(out["calls"]):
        assert call["max_diff_over_bound"] <= 1.0, (what, i, call)
        assert call["out_dims"] == call["ref_dims"], (what, i, call)


@pytest.mark.slow
@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weights", sorted(WEIGHTS))
def test_one_row_kernel_matches_the_builtin_then_delegates(check, weights, threads, isa):
    """One row through the kernel, then several rows and one row again through the built-in it
    creates from the kernel's weights (the kernel's copy is then released): every call within the
    bound, the built-in calls bit-exact with the reference net."""
    for n, k in SHAPES:
        for bias in ([], ["--bias"]):
            what = f"N={n} K={k} {weights} threads={threads} {bias} {isa}"
            out = run_check(check, n, k, "--rows", "1,5,1", "--threads", str(threads), "--seed", str(n + k),
                            *bias, *WEIGHTS[weights], *ISAS[isa])
            assert_within_bound(out, what)
            assert [c["gemv_calls"] for c in out["calls"]] == [1, 0, 0], what
            assert [c["max_abs_diff"] for c in out["calls"][1:]] == [0.0, 0.0], what


def kernel_label() -> str:
    """The label of the kernel's copy this CPU runs by default (gemv_layer_label)."""
    return "ncnnport-avx512" if "avx512f" in cpu_flags() else "ncnnport-avx2"


@pytest.mark.slow
@pytest.mark.parametrize("weights", sorted(WEIGHTS))
def test_both_register_widths_give_the_same_bits(check, weights):
    """The 16-lane and the 8-lane copies compute each output in the same order (bias, then one
    fused multiply-add per k), so they give the same bits (the hash of the outputs), and so the
    same differences from the reference; each names the copy that ran."""
    for n, k in SHAPES:
        runs = {isa: run_check(check, n, k, "--bias", "--seed", str(n * k), *WEIGHTS[weights], *extra)
                for isa, extra in ISAS.items()}
        assert runs["default"]["isa"] == kernel_label()
        assert all(runs[isa]["isa"] == "ncnnport-avx2" for isa in ISAS if isa != "default")
        first = {isa: {key: out["calls"][0][key] for key in ("out_sha256", "max_abs_diff", "identical", "gemv_calls")}
                 for isa, out in runs.items()}
        assert all(first[isa] == first["default"] for isa in ISAS), (n, k, weights, first)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp32", "fp16-storage"])
def test_the_prefetch_choice_samples_large_layers_and_changes_no_bits(check, weights):
    """gemv_prefetch.h: after the warm-up calls, the one-row calls of a layer of >= 4 MiB of weights
    alternate plain and prefetching reads, then the choice is made by the pairs prefetch won (the
    sequential sign test: 8 pairs, or 16 when the first 8 are neither clear); every call, sampled or
    not, gives the same bits for the same input; a small layer (in cache) never samples."""
    n = 2048 if weights == "fp32" else 4096  # x 1024 inputs = 8 MiB of weights either way
    rows = ",".join(["1"] * (PREFETCH_CALLS_TO_DECIDE + 4))
    out = run_check(check, n, 1024, "--rows", rows, "--same-input", "--bias", *WEIGHTS[weights])
    assert_within_bound(out, f"prefetch {weights}")
    assert_prefetch_decided(out["prefetch"])
    # the distance choice samples only prefetching calls the first choice did not sample
    distance = out["prefetch_distance"]
    assert distance["state"] == prefetch_state_expected(distance), distance
    if out["prefetch"]["state"] == "off":
        assert distance["samples_on"] == distance["samples_off"] == 0, distance
    assert len({c["out_sha256"] for c in out["calls"]}) == 1
    small = run_check(check, 64, 64, "--rows", "1,1,1", *WEIGHTS[weights])
    assert {k: small["prefetch"][k] for k in ("state", "samples_on", "samples_off", "pairs_won", "first")} == \
        {"state": "undecided", "samples_on": 0, "samples_off": 0, "pairs_won": 0,
         "first": {"pairs": 0, "won": 0, "state": ""}}


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp32", "fp16-storage"])
def test_the_narrow_layouts_streams_choice_samples_after_the_prefetch_plan_and_changes_no_bits(check, weights):
    """gemv_streams_choice: on calls the prefetch plan does not sample (after its pairs), an 8 MiB
    layer in the narrow layout alternates one block at a time and 4 side by side until the choice
    is made; every call gives the same bits for the same input, and the state is its pairs'."""
    n = 2048 if weights == "fp32" else 4096
    rows = ",".join(["1"] * (PREFETCH_CALLS_TO_DECIDE + 3 * 32 + 8))
    out = run_check(check, n, 1024, "--rows", rows, "--same-input", "--bias", "--avx2", *WEIGHTS[weights])
    assert_within_bound(out, f"streams {weights}")
    assert len({c["out_sha256"] for c in out["calls"]}) == 1
    streams = out["streams"]
    assert streams["samples_on"] >= 8 and streams["samples_off"] >= 8, streams
    assert streams["state"] == prefetch_state_expected(streams), streams


MIB = 1 << 20


def run_choice(built_cpp, calls: list[tuple[int, float, float]], min_bytes: int = MIB) -> dict:
    """ncnnport-prefetch-choice-check on scripted calls (bytes, plain GB/s, prefetching GB/s)."""
    tool = built_cpp(BUILD / "ncnnport-prefetch-choice-check", "NCNNPORT_CPP_BUILD")
    text = "".join(f"{b} {plain} {pre}\n" for b, plain, pre in calls)
    res = subprocess.run([str(tool), "--min-bytes", str(min_bytes)], input=text, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(res.stdout)


def warmed(calls: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    """``calls`` after the warm-up calls (of the first call's size, no difference between variants)."""
    return [(calls[0][0], 10.0, 10.0)] * PREFETCH_WARMUP_CALLS + calls


@pytest.mark.slow
@pytest.mark.parametrize("near, far, expected_far", [(12.0, 10.2, False), (12.0, 14.0, True)])
def test_a_plan_turns_prefetch_on_at_the_near_distance_and_tries_the_far_one(built_cpp, near, far, expected_far):
    """PrefetchPlan (the kernels' two choices): the first choice compares plain reads with the
    distance in use, the near one first, so a machine where only the near distance gains (this VM
    in some hours: plain 16.6, far 17.1, near 19.2 GB/s) still turns prefetch on; the prefetching
    calls the first choice does not sample then choose between near and far."""
    tool = built_cpp(BUILD / "ncnnport-prefetch-choice-check", "NCNNPORT_CPP_BUILD")
    calls = PREFETCH_WARMUP_CALLS + 16 + 24 * (PREFETCH_WARMUP_CALLS + 16 * 16)
    text = f"{8 * MIB} 10.0 {near} {far}\n" * calls
    out = json.loads(subprocess.run([str(tool), "--min-bytes", str(MIB), "--plan"], input=text, capture_output=True,
                                    text=True, timeout=60, check=True).stdout)
    assert out["report"]["first"]["state"] == "on" and out["report"]["state"] == "on", out["report"]
    distance = out["distance_report"]
    assert distance["state"] == ("on" if expected_far else "off"), distance
    # the far distance was tried; once chosen, most prefetching calls run the distance chosen (the
    # rest are the rechecks' pairs)
    last = [c["far"] for c in out["calls"][-200:] if c["prefetch"]]
    assert any(c["far"] for c in out["calls"]) and len(last) > 150
    share = sum(last) / len(last)
    assert (share > 0.8) if expected_far else (share < 0.2), share


@pytest.mark.slow
def test_the_distance_pairs_start_as_soon_as_prefetch_is_on(built_cpp):
    """The distance choice has no warm-up of its own: its first pair (near, then far) comes with the
    first prefetching call the first choice does not sample, right after that choice's warm-up and
    8 pairs (a second 48-call warm-up ran the untried distance on a read path already warm)."""
    tool = built_cpp(BUILD / "ncnnport-prefetch-choice-check", "NCNNPORT_CPP_BUILD")
    text = f"{8 * MIB} 10.0 12.0 14.0\n" * (PREFETCH_WARMUP_CALLS + 16 + 40)
    out = json.loads(subprocess.run([str(tool), "--min-bytes", str(MIB), "--plan"], input=text, capture_output=True,
                                    text=True, timeout=60, check=True).stdout)
    decided = PREFETCH_WARMUP_CALLS + 16
    assert [c["far"] for c in out["calls"][:decided]] == [False] * decided
    # unsampled by the first choice from here: the distance choice's first block of two pairs, one
    # near first and one far first
    far = [c["far"] for c in out["calls"][decided:decided + 4]]
    assert far[0] != far[1] and far[2] != far[3] and far[0] != far[2], out["calls"][decided:]
    assert out["distance_report"]["samples_on"] >= 8, out["distance_report"]


@pytest.mark.slow
@pytest.mark.parametrize("plain, prefetching, every", [(10.0, 16.0, 60), (10.0, 11.0, 16), (16.0, 10.0, 60)])
def test_the_recheck_interval_holds_the_rechecks_cost_near_one_percent(built_cpp, plain, prefetching, every):
    """Once decided, the variant not chosen runs one call per recheck interval, and the interval is
    (max(r, 1/r) - 1) / 1 % calls (at least 16, at most 256), r the recent speed ratio: prefetch 1.6x
    faster (a device lease read 5.5 GB/s plain, 10.1 prefetching) rechecks every 60th call, so its
    plain calls cost under 1 % of the stream's time where 1 in 16 cost 3.75 %; a 10 % gain stays
    at 16 (near the bounds a switch must stay quick); a loss of the same size (prefetch off) alike."""
    out = run_choice(built_cpp, [(8 * MIB, plain, prefetching)] * 6000, min_bytes=4 * MIB)
    report = out["report"]
    assert report["recheck_every"] == every and report["switches"] == 0, report
    chosen = report["state"] == "on"
    after = out["calls"][PREFETCH_WARMUP_CALLS + 16:]
    others = sum(c["prefetch"] != chosen for c in after)
    assert len(after) / (every + 1) - 2 <= others <= len(after) / every + 1, (others, len(after), every)
    r = prefetching / plain
    assert others / len(after) * (max(r, 1 / r) - 1) <= 0.0105 or every == 16, others


@pytest.mark.slow
def test_the_warm_up_calls_are_neither_sampled_nor_prefetched(built_cpp):
    """A clear 20 % gain from the first call: the warm-up calls still run plain and unsampled, then
    the pairs start (why: fresh weights read slowly in a run's first ~second, gemv_prefetch.h)."""
    out = run_choice(built_cpp, [(8 * MIB, 10.0, 12.0)] * (PREFETCH_WARMUP_CALLS + 16), min_bytes=4 * MIB)
    warm, rest = out["calls"][:PREFETCH_WARMUP_CALLS], out["calls"][PREFETCH_WARMUP_CALLS:]
    assert not any(c["prefetch"] or c["sample"] for c in warm), warm
    # 8 pairs, each one call of either variant, in blocks of two: one plain first, one prefetching first
    order = [c["prefetch"] for c in rest]
    assert all(c["sample"] for c in rest) and all(a != b for a, b in zip(order[::2], order[1::2])), rest
    assert all(order[i] != order[i + 2] for i in range(0, 16, 4)), order
    assert out["report"]["first"] == {"pairs": 8, "won": 8, "state": "on"}, out["report"]


@pytest.mark.slow
def test_the_prefetch_choice_pairs_only_calls_of_one_size(built_cpp):
    """Qwen3-ASR's int8 decode layer order (2, 1, 1, 2, 3, 3, 3 MiB): every pair is two sampled
    calls of one size, one in each variant, and a real 10 % gain is found."""
    layer = [2 * MIB, MIB, MIB, 2 * MIB, 3 * MIB, 3 * MIB, 3 * MIB]
    out = run_choice(built_cpp, [(b, 10.0, 11.0) for b in layer * 24])
    # the rule: a sampled call of the pending pair's size completes it in the other variant; any other
    # sampled call starts a pair (taking an unpaired one's place)
    pending, pairs = None, 0
    for call in (c for c in out["calls"] if c["sample"]):
        if pending is not None and call["bytes"] == pending["bytes"]:
            assert call["prefetch"] != pending["prefetch"], (pending, call)
            pending, pairs = None, pairs + 1
        else:
            pending = call
    assert pairs >= 8, pairs
    assert out["report"]["first"] == {"pairs": 8, "won": 8, "state": "on"}, out["report"]
    assert out["report"]["state"] == "on" and out["report"]["switches"] == 0, out["report"]


@pytest.mark.slow
def test_an_unclear_first_eight_pairs_take_eight_more(built_cpp):
    """A real 20 % gain with two of the first 8 prefetching calls stalled (6 wins: the 2-core
    Xeon's false 'off') is decided on 16 pairs and kept; with no gain and the same 6 lucky pairs
    the 16 read at most 6 + 0 wins and prefetch stays off; a clear first 8 decides at once."""
    big = 8 * MIB
    stalled = {1, 4}  # pairs whose prefetching call stalls (3 GB/s)
    gain = [(big, 10.0, 3.0 if i in stalled else 12.0) for i in range(16) for _ in (0, 1)]
    out = run_choice(built_cpp, warmed(gain), min_bytes=4 * MIB)["report"]
    assert (out["state"], out["samples_on"], out["first"]) == ("on", 16, {"pairs": 16, "won": 14, "state": "on"}), out
    assert out["pairs_won"] == 14 and out["recent_ratio"] == pytest.approx(1.2), out
    lucky = {0, 2, 3, 5, 6, 7}  # 6 of the first 8 read faster by chance, none after
    none = [(big, 10.0, 12.0 if i in lucky else 10.0) for i in range(16) for _ in (0, 1)]
    out = run_choice(built_cpp, warmed(none), min_bytes=4 * MIB)["report"]
    assert (out["state"], out["samples_on"], out["first"]) == ("off", 16, {"pairs": 16, "won": 6, "state": "off"}), out
    clear = run_choice(built_cpp, warmed([(big, 10.0, 12.0)] * 40), min_bytes=4 * MIB)["report"]
    assert (clear["state"], clear["first"]["pairs"]) == ("on", 8), clear


@pytest.mark.slow
def test_the_choice_follows_a_gain_that_comes_and_goes(built_cpp):
    """No gain in the first pairs (off), then a real 10 % gain (measured on the 2-core Xeon: prefetch
    gained nothing in one half hour and 8-11 % in the one before, gemv_prefetch.h), then a loss: once
    decided, every 16th call starts a pair, the state turns on when the median speed ratio of the last
    16 pairs reaches 1.03 (here when 8 of them read the gain) and off again at 1 or less (8 read the
    loss). Between the switches the calls run the chosen variant."""
    big = 8 * MIB
    phases = [(10.0, 10.0, 16 * 2), (10.0, 11.0, 16 * 20), (10.0, 9.0, 16 * 20)]  # plain, prefetch, calls
    out = run_choice(built_cpp, warmed([(big, plain, pre) for plain, pre, n in phases for _ in range(n)]),
                     min_bytes=4 * MIB)
    report = out["report"]
    assert report["first"] == {"pairs": 8, "won": 0, "state": "off"}, report
    assert report["switches"] == 2 and report["state"] == "off" and report["recent_ratio"] == pytest.approx(0.9), report
    calls = out["calls"][PREFETCH_WARMUP_CALLS:]
    runs = "".join("1" if c["prefetch"] else "0" for c in calls if not c["sample"])
    assert runs.strip("0").count("0") == 0 and "1" * 100 in runs, runs  # one stretch of prefetching calls
    # a pair every 16 calls once decided: 8 pairs after the gain came, and 8 after the loss came
    on_at = next(i for i, c in enumerate(calls) if c["prefetch"] and not c["sample"])
    assert 32 + 7 * 16 <= on_at <= 32 + 9 * 16, on_at
    off_at = next(i for i, c in enumerate(calls) if i > on_at and not c["prefetch"] and not c["sample"])
    assert 32 + 320 + 7 * 16 <= off_at <= 32 + 320 + 9 * 16, off_at


@pytest.mark.slow
def test_a_decided_choice_pairs_a_call_with_the_next_of_its_size(built_cpp):
    """Once decided, the pair a recheck starts on one size is completed by the next call of that
    size, whatever runs between (the head of the next decode step, not the projection after it),
    and the starts step through every position of a repeating step (21 calls here, Qwen3-ASR's
    fp16 count), the head's included."""
    head, proj = 300 * MIB, 4 * MIB
    step = [(proj, 10.0, 10.0)] * 20 + [(head, 10.0, 10.0)]
    out = run_choice(built_cpp, warmed(step * 24), min_bytes=4 * MIB)
    sampled = [(i, c) for i, c in enumerate(out["calls"]) if c["sample"]]
    first_pairs = 2 * out["report"]["first"]["pairs"]
    orders = []
    for (i, first), (j, second) in zip(sampled[first_pairs::2], sampled[first_pairs + 1::2]):
        assert first["prefetch"] != second["prefetch"] and first["bytes"] == second["bytes"], (i, j)
        orders.append(first["prefetch"])
    # blocks of two pairs, one of each order
    assert len(orders) >= 6 and all(a != b for a, b in zip(orders[0::2], orders[1::2])), orders
    assert any(c["bytes"] == head for _, c in sampled[first_pairs:]), sampled


@pytest.mark.slow
def test_a_size_difference_is_not_read_as_a_prefetch_gain(built_cpp):
    """Small calls slower than large ones whatever the variant: alternating 1 and 3 MiB calls
    never form a pair (the rule before paired them and read the 3 MiB calls' speed as prefetch's),
    and with no difference between the variants the sign test keeps prefetch off."""
    mixed = run_choice(built_cpp, [(MIB, 10.0, 10.0), (3 * MIB, 15.0, 15.0)] * (PREFETCH_WARMUP_CALLS + 20))["report"]
    assert mixed["state"] == "undecided" and mixed["samples_on"] == 0, mixed
    same = run_choice(built_cpp, [(3 * MIB, 15.0, 15.0)] * (PREFETCH_WARMUP_CALLS + 20))["report"]
    assert same["state"] == "off" and same["pairs_won"] == 0, same


@pytest.mark.slow
def test_a_later_call_reading_faster_is_not_read_as_a_prefetch_gain(built_cpp):
    """Whatever favours the second call of a pair, with no difference between the variants, leaves
    prefetch off: a machine speeding up call by call (a run warming up), or the second of two
    same-size projections reading faster (gate then up, the one after in memory). With plain always
    first (the rule before) both read as 8 wins of 8; with both orders in every block of two pairs,
    prefetch has the faster call in half the pairs only."""
    warming = [(8 * MIB, 10.0 * 1.05 ** i, 10.0 * 1.05 ** i) for i in range(40)]  # 5 % faster per call
    out = run_choice(built_cpp, warmed(warming), min_bytes=4 * MIB)["report"]
    assert out["first"] == {"pairs": 8, "won": 4, "state": "off"}, out
    second_faster = [(6 * MIB, 10.0, 10.0), (6 * MIB, 11.0, 11.0)]  # gate, up: same size, the second faster
    out = run_choice(built_cpp, warmed(second_faster * 20), min_bytes=4 * MIB)["report"]
    assert out["first"] == {"pairs": 8, "won": 4, "state": "off"}, out


@pytest.mark.slow
def test_a_replaced_first_call_keeps_its_blocks_order(built_cpp):
    """A block's second pair runs the order opposite to its first pair's, even where its first call
    was taken over by a call of another size before its pair came."""
    big, other = 8 * MIB, 4 * MIB
    calls = [(big, 10.0, 10.0)] * PREFETCH_WARMUP_CALLS + [(big, 10.0, 10.0)] * 2 + \
        [(other, 10.0, 10.0), (big, 10.0, 10.0), (other, 10.0, 10.0), (big, 10.0, 10.0), (big, 10.0, 10.0)]
    sampled = [c for c in run_choice(built_cpp, calls)["calls"] if c["sample"]]
    first_pair, second_pair = sampled[0:2], sampled[-2:]
    assert first_pair[0]["prefetch"] != first_pair[1]["prefetch"], first_pair
    assert second_pair[0]["prefetch"] != second_pair[1]["prefetch"], second_pair
    assert second_pair[0]["prefetch"] != first_pair[0]["prefetch"], sampled


@pytest.mark.slow
def test_a_real_gain_is_found_while_the_machine_warms_up(built_cpp):
    """A real 8 % gain on a machine reading 2 % faster with every call: prefetch wins its pairs in
    either order (1.08 x 1.02 and 1.08 / 1.02 both past the 3 % margin), so it is on after 8 pairs
    and stays on."""
    warming = [(8 * MIB, 10.0 * 1.02 ** i, 10.8 * 1.02 ** i) for i in range(PREFETCH_WARMUP_CALLS + 16 + 200)]
    out = run_choice(built_cpp, warming, min_bytes=4 * MIB)["report"]
    assert out["first"] == {"pairs": 8, "won": 8, "state": "on"} and out["state"] == "on", out


@pytest.mark.slow
@pytest.mark.parametrize("act", [0, 1, 2, 3])
def test_one_dimensional_input_and_activations(check, act):
    """A 1-D input (ncnn's flatten path, elempack-8 output there) gives the same values and rank;
    relu, leakyrelu and clip are applied as ncnn's activation_ss does."""
    for n, k in [(37, 63), (64, 64), (1000, 1001)]:
        out = run_check(check, n, k, "--dims1", "--bias", "--act", str(act), "--seed", "7")
        assert_within_bound(out, f"N={n} K={k} act={act}")
        assert out["calls"][0]["gemv_calls"] == 1 and out["calls"][0]["out_dims"] == 1


@pytest.mark.slow
def test_several_rows_first_stay_on_the_builtin(check):
    """A graph that first runs several rows (prefill) builds the built-in from the raw weights and
    keeps no kernel copy: later one-row calls are the built-in's too, bit-exact."""
    out = run_check(check, 130, 333, "--rows", "4,1", "--bias")
    assert [c["gemv_calls"] for c in out["calls"]] == [0, 0]
    assert [c["max_abs_diff"] for c in out["calls"]] == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# the executables report which InnerProduct ran


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    import soundfile as sf

    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

    path = tmp_path_factory.mktemp("gemv_audio") / "mono16k.wav"
    sf.write(str(path), synth_speechlike(3.0, seed=5), 16000, subtype="FLOAT")
    return path


def run_exe(argv: list[str]) -> dict:
    out = Path(argv[argv.index("--json-out") + 1])
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    assert "overwrite built-in layer" not in res.stderr  # ncnn's registration log stays quiet
    return json.loads(out.read_text())


def cpu_flags() -> set[str]:
    """This machine's x86 feature flags (/proc/cpuinfo), empty where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())


def assert_auto_rule(auto: dict) -> None:
    """The default (Auto) runs the kernel on every CPU that runs it, in 16 lanes where the CPU has
    AVX-512F; the JSON still says whether ncnn's own copy (--ncnn-gemv) would be its AVX-512 one,
    which the default build (--isa avx512) has on every CPU with AVX-512F."""
    timing = auto["timing"]
    assert timing["gemv_ncnn_avx512"] == ("avx512f" in cpu_flags())
    assert timing["gemv"] == kernel_label()
    assert timing["gemv_calls"] > 0
    # the prefetch choice of each weight width and its distance choice: sampled pairs, and a state
    # that follows them
    for width, p in [*timing["gemv_prefetch"].items(), *timing["gemv_prefetch_distance"].items()]:
        assert p["state"] == prefetch_state_expected(p), (width, p)
    # every kernel call is in the weight streams' record (stream_times.h), at a positive speed
    streams = timing["weight_streams"]
    assert sum(r["calls"] for w in ("fp32", "fp16") for r in streams[w]) == timing["gemv_calls"], streams
    assert sum(r["calls"] for r in streams["int8"]) == timing["int8_gemv_calls"], streams
    assert all(r["gbps"] > 0 and r["seconds"] > 0 and r["bytes"] > 0 for w in streams for r in streams[w]), streams


@pytest.mark.slow
def test_qwen3_asr_json_names_the_kernel_and_ids_do_not_change(built_cpp, package, speech, tmp_path):
    exe = built_cpp(BUILD / "ncnnport-qwen3-asr", "NCNNPORT_CPP_BUILD")
    pkg = package("qwen3-asr")
    base = [str(exe), "--package", str(pkg), "--audio", str(speech), "--max-new-tokens", "24"]
    ours = run_exe([*base, "--json-out", str(tmp_path / "ours.json"), "--gemv-kernel"])
    builtin = run_exe([*base, "--json-out", str(tmp_path / "builtin.json"), "--ncnn-gemv"])
    auto = run_exe([*base, "--json-out", str(tmp_path / "auto.json")])
    if {"avx2", "fma", "f16c"} <= cpu_flags():
        assert_auto_rule(auto)
    assert [c["token_ids"] for c in auto["chunks"]] == [c["token_ids"] for c in builtin["chunks"]]
    if ours["timing"]["gemv"] == "ncnn":
        pytest.skip("this CPU lacks AVX2 / FMA / F16C: the overwrite is not registered")
    assert ours["timing"]["gemv"] == kernel_label() and builtin["timing"]["gemv"] == "ncnn"
    # every decode step runs the layers' and the head's InnerProducts on one row
    assert ours["timing"]["gemv_calls"] >= ours["timing"]["decode_steps"] > 0
    assert builtin["timing"]["gemv_calls"] == 0
    assert [c["token_ids"] for c in ours["chunks"]] == [c["token_ids"] for c in builtin["chunks"]]


@pytest.mark.slow
def test_youtu_vl_json_names_the_layer_and_ids_do_not_change(built_cpp, package, tmp_path):
    """Youtu-VL's C++ decode runs the layers' pnnx Gemm graphs (its InnerProduct `.decode`
    variants are the Python loop's fp16-storage path), so the kernel has no InnerProduct to run
    there: the JSON says so by its count, and the ids are the built-in's."""
    exe = built_cpp(BUILD / "ncnnport-youtu-vl", "NCNNPORT_CPP_BUILD")
    pkg = package("youtu-vl")
    base = [str(exe), "--package", str(pkg), "--prompt", "Tell me a short story.", "--max-new-tokens", "24"]
    ours = run_exe([*base, "--json-out", str(tmp_path / "ours.json"), "--gemv-kernel"])
    builtin = run_exe([*base, "--json-out", str(tmp_path / "builtin.json"), "--ncnn-gemv"])
    if ours["timing"]["gemv"] == "ncnn":
        pytest.skip("this CPU lacks AVX2 / FMA / F16C: the overwrite is not registered")
    assert ours["timing"]["gemv"] == kernel_label()
    assert builtin["timing"]["gemv"] == "ncnn" and builtin["timing"]["gemv_calls"] == 0
    assert np.array_equal(ours["chunks"][0]["token_ids"], builtin["chunks"][0]["token_ids"])
