"""ncnnport's int8 Gemm overwrite (runtime/cpp/src/int8_gemv_layer.cpp): the one-row products of
package-int8w's decode graphs.

`ncnnport-int8-gemv-check` (runtime/cpp/tools/int8_gemv_check.cpp) loads one random int8-weights
Gemm (quantize_term 80y) twice, with and without the overwrite, and reports the largest difference
over the bound it derives: both quantize the input identically, so every block's integer sum is
the same exact integer and only the fp32 additions over the blocks may differ (2 * gamma(blocks +
2) times the sum of the terms' magnitudes; an input element one quantization step off moves an
output far outside it). The executable's JSON must say which Gemm ran and prove it by its count,
with the token ids unchanged. Slow: they need `make cpp` (and the executable a tiny package).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cpp.layer_check import (PREFETCH_CALLS_TO_DECIDE, assert_prefetch_decided, prefetch_state_expected,
                                   run_layer_check)
from tests.cpp.test_gemv_layer import run_exe, speech  # noqa: F401  (speech is a fixture)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
CHECK = BUILD / "ncnnport-int8-gemv-check"

# (N, K, block, bias): Qwen3-ASR's decode projections (q, o, MLP) and its head's K; N off the
# 16 rows of a group (100, 37, 17) and under one group; every block size; a last block shorter
# than the others (K 96 and 1040, the tiny presets' widths are such); with and without C; an
# output past output_store.h's 128 KiB (streaming stores; its last group of 3 rows stored plainly).
SHAPES = [(2048, 1024, 128, 1), (1024, 3072, 128, 0), (100, 256, 128, 0), (37, 128, 64, 1), (17, 64, 32, 1),
          (1, 128, 128, 1), (48, 96, 128, 1), (33, 1040, 128, 0), (65555, 64, 64, 1)]


@pytest.fixture(scope="module")
def check(built_cpp) -> Path:
    return built_cpp(CHECK, "NCNNPORT_CPP_BUILD")


def run_check(check: Path, n: int, k: int, *extra: str) -> dict:
    return run_layer_check([str(check), "--n", str(n), "--k", str(k), *extra], "AVX-512 VNNI")


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_one_row_products_run_the_kernel_within_the_summation_bound(check, shape, threads):
    n, k, block, bias = shape
    out = run_check(check, n, k, "--block", str(block), "--bias", str(bias), "--threads", str(threads), "--seed", "3")
    assert out["kernel_calls"] == 1, out
    assert out["out_shape"] == [1, n], out
    assert out["max_diff_over_bound"] <= 1.0, out


@pytest.mark.slow
def test_prefetching_and_plain_calls_give_the_same_bits(check):
    """A 3 MB layer (Qwen3-ASR's MLP projection) is past the int8 kernel's 1 MiB sampling size:
    its first 16 (or 32) calls alternate the plain and prefetching variants (gemv_prefetch.h), and every
    call must give the first call's bits; a 0.1 MB layer is never sampled."""
    out = run_check(check, 3072, 1024, "--rounds", str(PREFETCH_CALLS_TO_DECIDE + 4))
    assert out["kernel_calls"] == 1 and out["rounds_equal_first"] is True, out
    assert_prefetch_decided(out["prefetch"])
    # the distance choice samples only prefetching calls the first choice did not sample
    distance = out["prefetch_distance"]
    assert distance["state"] == prefetch_state_expected(distance), distance
    if out["prefetch"]["state"] == "off":
        assert distance["samples_on"] == distance["samples_off"] == 0, distance
    small = run_check(check, 128, 1024, "--rounds", "3")
    assert small["rounds_equal_first"] is True and small["prefetch"]["state"] == "undecided", small


@pytest.mark.slow
def test_the_kernel_copy_lives_in_the_huge_page_arena(check):
    """kernel_weight_allocator.h: the kernel's copy (16 rows of K bytes per group, padded to a
    whole group) is cut from the arena, and reported live (ncnn's Mat adds its 4-byte refcount)."""
    out = run_check(check, 8192, 1024)  # 8 MiB of int8 weights, 512 groups of 16 rows
    assert out["kernel_calls"] == 1 and out["max_diff_over_bound"] <= 1.0, out
    assert out["kernel_weights_huge_bytes"] == 8192 * 1024 + 4, out
    out = run_check(check, 100, 256)  # 7 groups: 112 rows
    assert out["kernel_weights_huge_bytes"] == 112 * 256 + 4, out


@pytest.mark.slow
def test_several_rows_stay_on_the_builtin_inside_the_overwrite(check):
    """A prefill-shaped call (3 rows) goes to ncnn's Gemm, built from the kernel's copy of the
    weights on first need: its numbers are ncnn's, bit for bit."""
    out = run_check(check, 64, 256, "--rows", "3")
    assert out["kernel_calls"] == 0 and out["bit_equal"], out


@pytest.mark.slow
def test_a_layout_the_kernel_does_not_take_stays_on_the_builtin(check):
    """K not a multiple of 16 (the kernel's step): the overwrite delegates the whole layer to ncnn's Gemm."""
    out = run_check(check, 48, 100, "--block", "32")
    assert out["kernel_calls"] == 0 and out["bit_equal"], out


@pytest.mark.slow
def test_check_refuses_a_bad_command_line(check):
    res = subprocess.run([str(check), "--n", "4", "--k", "64", "--block", "48"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 2 and "--block" in res.stderr


@pytest.mark.slow
def test_qwen3_asr_int8_package_json_names_the_gemm_and_ids_do_not_change(built_cpp, speech, tmp_path):
    """package-int8w through the executable: the overwrite computes every decode projection and
    the head (7 per layer + 1 per step) and the ids equal those of ncnn's own int8 Gemm."""
    from tests.cpp.packages import tiny_precision_package

    exe = built_cpp(BUILD / "ncnnport-qwen3-asr", "NCNNPORT_CPP_BUILD")
    pkg = tiny_precision_package("qwen3-asr", "int8-weights")
    base = [str(exe), "--package", str(pkg), "--audio", str(speech), "--max-new-tokens", "24"]
    ours = run_exe([*base, "--json-out", str(tmp_path / "ours.json")])
    plain = run_exe([*base, "--json-out", str(tmp_path / "plain.json"), "--ncnn-int8"])
    assert [c["token_ids"] for c in ours["chunks"]] == [c["token_ids"] for c in plain["chunks"]]
    mine, theirs = ours["timing"], plain["timing"]
    assert theirs["int8_gemv"] == "ncnn" and theirs["int8_gemv_calls"] == 0
    if mine["int8_gemv"] == "ncnn":
        pytest.skip("this CPU lacks AVX-512 VNNI: the int8 Gemm overwrite is not registered")
    assert mine["int8_gemv"] == "ncnnport-avx512vnni"
    layers = sum(1 for name in mine["graph_s"] if name.startswith("decode_layer"))
    assert layers > 0 and mine["int8_gemv_calls"] >= (7 * layers + 1) * mine["decode_steps"] > 0, mine
