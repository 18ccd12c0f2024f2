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
from tests.cpp.test_gemv_layer import cpu_flags, run_exe, speech  # noqa: F401  (speech is a fixture)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
CHECK = BUILD / "ncnnport-int8-gemv-check"

# (N, K, block, bias): Qwen3-ASR's decode projections (q, o, MLP) and its head's K; N off the
# 16 rows of a group (100, 37, 17) and under one group; every block size; a last block shorter
# than the others (K 96 and 1040, the tiny presets' widths are such); with and without C; an
# output past output_store.h's 128 KiB (streaming stores; its last group of 3 rows stored plainly).
SHAPES = [(2048, 1024, 128, 1), (1024, 3072, 128, 0), (100, 256, 128, 0), (37, 128, 64, 1), (17, 64, 32, 1),
          (1, 128, 128, 1), (48, 96, 128, 1), (33, 1040, 128, 0), (65555, 64, 64, 1)]
# the kernel's copies: the default (AVX-512 VNNI where the CPU has it) and the AVX2 one, whose
# variants read one row group at a time or 4 side by side (its default: the machine's choice)
ISAS = {"default": [], "avx2": ["--avx2"], "avx2-1-stream": ["--avx2", "--streams", "1"],
        "avx2-4-streams": ["--avx2", "--streams", "4"]}


def kernel_label() -> str:
    """The copy this CPU runs by default (int8_gemv_layer_label)."""
    return "ncnnport-avx512vnni" if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags() else "ncnnport-avx2"


@pytest.fixture(scope="module")
def check(built_cpp) -> Path:
    return built_cpp(CHECK, "NCNNPORT_CPP_BUILD")


def run_check(check: Path, n: int, k: int, *extra: str) -> dict:
    return run_layer_check([str(check), "--n", str(n), "--k", str(k), *extra], "AVX2 and FMA")


@pytest.mark.slow
@pytest.mark.parametrize("isa", sorted(ISAS))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_one_row_products_run_the_kernel_within_the_summation_bound(check, shape, threads, isa):
    n, k, block, bias = shape
    out = run_check(check, n, k, "--block", str(block), "--bias", str(bias), "--threads", str(threads), "--seed", "3",
                    *ISAS[isa])
    assert out["kernel_calls"] == 1, out
    assert out["isa"] == (kernel_label() if isa == "default" else "ncnnport-avx2"), out
    if isa == "avx2-4-streams" and n >= 4 * 16 * threads:  # 4 groups of 16 rows per thread: side by side
        assert out["out_sha256"] == run_check(check, n, k, "--block", str(block), "--bias", str(bias), "--threads",
                                               str(threads), "--seed", "3", *ISAS["avx2-1-stream"])["out_sha256"]
    assert out["out_shape"] == [1, n], out
    assert out["max_diff_over_bound"] <= 1.0, out


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_both_copies_give_the_same_bits(check, threads):
    """The AVX2 copy's products (maddubs of |x| and the signed weights, then madd) give the VNNI
    copy's exact integer per block and the same fp32 chain per row: the same output bits (their
    hash), so the same difference from ncnn's own Gemm, whether it reads one row group at a time
    or 4 side by side. On an AVX2-only CPU the default run is the AVX2 copy too."""
    for n, k, block, bias in SHAPES:
        runs = {isa: run_check(check, n, k, "--block", str(block), "--bias", str(bias), "--threads", str(threads),
                               "--seed", str(n + k), *extra) for isa, extra in ISAS.items()}
        first = {isa: {key: out[key] for key in ("out_sha256", "max_abs_diff", "kernel_calls")} for isa, out in runs.items()}
        assert all(first[isa] == first["default"] for isa in ISAS), (n, k, block, first)


@pytest.mark.slow
def test_the_avx2_streams_choice_samples_after_the_prefetch_plan_and_changes_no_bits(check):
    """int8_gemv_streams_choice: on calls the prefetch plan does not sample (after its pairs), a 3 MB
    layer's calls alternate one stream and 4 side by side until the choice is made; every call
    gives the first call's bits and the state is what its pairs give."""
    out = run_check(check, 3072, 1024, "--avx2", "--rounds", str(PREFETCH_CALLS_TO_DECIDE + 3 * 32 + 8))
    assert out["kernel_calls"] == 1 and out["rounds_equal_first"] is True, out
    streams = out["streams"]
    assert streams["samples_on"] >= 8 and streams["samples_off"] >= 8, streams
    assert streams["state"] == prefetch_state_expected(streams), streams


@pytest.mark.slow
def test_a_weight_of_minus_128_keeps_the_avx2_copy_out(check):
    """ncnn's quantizer writes +-127; a layer holding -128 (another writer) would be negated wrongly
    by the AVX2 copy's sign trick (-(-128) wraps), so that layer runs ncnn's Gemm there, bit for
    bit, while the VNNI copy (unsigned bytes w + 128) still takes it within the bound."""
    avx2 = run_check(check, 64, 256, "--minus-128", "--avx2")
    assert avx2["kernel_calls"] == 0 and avx2["bit_equal"], avx2
    if kernel_label() == "ncnnport-avx512vnni":
        vnni = run_check(check, 64, 256, "--minus-128")
        assert vnni["kernel_calls"] == 1 and vnni["max_diff_over_bound"] <= 1.0, vnni


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
        pytest.skip("this CPU lacks AVX2 and FMA: the int8 Gemm overwrite is not registered")
    assert mine["int8_gemv"] == kernel_label()
    layers = sum(1 for name in mine["graph_s"] if name.startswith("decode_layer"))
    assert layers > 0 and mine["int8_gemv_calls"] >= (7 * layers + 1) * mine["decode_steps"] > 0, mine
