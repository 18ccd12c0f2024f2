"""ncnnport's MatMul overwrite (runtime/cpp/src/matmul_layer.cpp) and the huge-page backing of
CPU weights (runtime/cpp/src/huge_pages.cpp).

`ncnnport-matmul-check` (runtime/cpp/tools/matmul_check.cpp) loads one random batched MatMul
twice, with and without the overwrite, and reports the largest difference over the fp32
summation-order bound it derives (2 * gamma(K + 1) * sum |a_k b_k| per output, see the tool's
header) and how many products the overwrite computed itself. The executables' JSON must say
which MatMul ran and prove it by that count, with the token ids unchanged, and must say what the
huge-page step did. Slow: they need `make cpp` (and the executables a tiny package).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cpp.layer_check import (PREFETCH_CALLS_TO_DECIDE, assert_prefetch_decided, prefetch_state_expected,
                                   run_layer_check)
from tests.cpp.test_gemv_layer import cpu_flags, run_exe, speech  # noqa: F401  (speech is a fixture)

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
CHECK = BUILD / "ncnnport-matmul-check"
STREAM_ROWS = 8  # kStreamMaxRows (matmul_layer.h): the stream kernels up to here
MAX_ROWS = 64  # kMatmulMaxRows: the many-row kernels above STREAM_ROWS (16 or 8 lanes), the built-in past it

# (heads, M, K, N): Qwen3-ASR's decode (8 KV heads, 2 query heads each, d = 128) at a short and
# a long context; query rows in every split the scores take (passes of 4, then 3, 2 or 1 rows:
# M = 1-8); K through each of the kernels' steps (16-blocks, one 8-block, a scalar rest: 13, 20,
# 24, 40); the most rows the stream kernels take; 1 x 1 x 1; the scores' head groups (heads side by
# side: 4 of Qwen3-ASR's 8, then 2 of 6 heads, one of 3).
SHAPES = [(8, 2, 128, 100), (8, 2, 128, 1039), (3, 5, 13, 7), (2, STREAM_ROWS, 64, 101), (1, 1, 1, 1), (4, 3, 20, 4),
          (2, 6, 24, 9), (2, 7, 40, 5), (1, 4, 128, 33), (6, 1, 24, 9), (3, 4, 40, 17)]
# The many-row kernels: Youtu-VL's MLA decode (one head, 32 query rows; latent 512 and rope 64
# wide; both products, the weighted one also as the model has it: 1039 cache rows of 512) at a
# short and a long context, and two new tokens (64 rows); query rows
# in 1-4 vectors of 16 (9, 17, 40, 64), cache rows through the scores' tiles of 16 / 8 / 6 / 4
# and a rest (N = 7, 101, 1039, 23, 35); weighted rows in groups of 8 and a rest of 1-7 (9, 17,
# 40, 63); J (= N of the weighted product) through 32-wide slices, a 16-wide one and masked
# rests (7, 23, 35, 48, 101); K odd and short (1, 13); two heads.
MANY = [(1, 32, 512, 100), (1, 32, 512, 1039), (1, 32, 1039, 512), (1, 32, 64, 1039), (1, MAX_ROWS, 512, 101), (1, STREAM_ROWS + 1, 13, 7),
        (1, 17, 20, 23), (2, 40, 1, 35), (2, 63, 40, 48), (1, 33, 16, 101)]


@pytest.fixture(scope="module")
def check(built_cpp) -> Path:
    return built_cpp(CHECK, "NCNNPORT_CPP_BUILD")


def run_check(check: Path, heads: int, m: int, k: int, n: int, *extra: str) -> dict:
    return run_layer_check([str(check), "--heads", str(heads), "--m", str(m), "--k", str(k), "--n", str(n), *extra],
                           "AVX2 / FMA")


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("trans_b", [1, 0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_products_run_the_kernel_within_the_summation_bound(check, shape, trans_b, threads):
    out = run_check(check, *shape, "--trans-b", str(trans_b), "--threads", str(threads), "--seed", "7")
    assert_kernel_within_bound(out, shape, chain=trans_b == 0)


def assert_kernel_within_bound(out: dict, shape: tuple[int, int, int, int], chain: bool) -> None:
    """The overwrite computed the product itself, in the built-in's shape, within the summation
    bound; where `chain` (the weighted sums, and both products of the many-row kernels) every output
    is exactly the k-ascending fused chain those kernels promise."""
    assert out["kernel_calls"] == 1, out
    assert out["out_shape"] == [shape[0], shape[1], shape[3]], out
    assert out["max_diff_over_bound"] <= 1.0, out
    if chain:
        assert out["equals_fma_chain"], out


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("trans_b", [1, 0])
@pytest.mark.parametrize("shape", MANY, ids=lambda s: "x".join(map(str, s)))
def test_many_query_rows_run_the_many_row_kernels_within_the_summation_bound(check, shape, trans_b, threads):
    out = run_check(check, *shape, "--trans-b", str(trans_b), "--threads", str(threads), "--seed", "11")
    assert out["many_rows"] is True, out  # AVX2 and FMA (run_check skips without): 16 or 8 lanes
    assert_kernel_within_bound(out, shape, chain=True)


@pytest.mark.slow
@pytest.mark.parametrize("trans_b", [1, 0])
def test_many_row_kernels_give_the_same_bits_at_any_thread_count(check, trans_b, tmp_path):
    """Each output is one tile's, in one order, however the cache rows or column slices are split."""
    outs = [run_check(check, 1, 32, 40, 101, "--trans-b", str(trans_b), "--threads", str(t), "--seed", "3",
                      "--dump", str(tmp_path / f"{t}.bin")) for t in (1, 2, 3)]
    assert all(o["kernel_calls"] == 1 and o["many_rows"] for o in outs), outs
    assert (tmp_path / "1.bin").read_bytes() == (tmp_path / "2.bin").read_bytes() == (tmp_path / "3.bin").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["fp32", "fp16"])
def test_stream_scores_give_the_same_bits_in_any_head_group(check, cache, tmp_path):
    """The few-row scores read 4, 2 or 1 heads' cache slices side by side, as many as still give
    every thread a group (8 heads: 4 at 1-2 threads, 2 at 3-4, 1 at 5); each output is the same
    chain in every grouping."""
    extra = ["--fp16-cache"] if cache == "fp16" else []
    outs = [run_check(check, 8, 2, 40, 101, "--trans-b", "1", "--threads", str(t), "--seed", "5", *extra,
                      "--dump", str(tmp_path / f"{t}.bin")) for t in (1, 3, 5)]
    assert all(o["kernel_calls"] == 1 and o["max_diff_over_bound"] <= 1.0 for o in outs), outs
    assert (tmp_path / "1.bin").read_bytes() == (tmp_path / "3.bin").read_bytes() == (tmp_path / "5.bin").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("trans_b", [1, 0])
def test_stream_kernels_give_the_same_bits_prefetching_or_not(check, trans_b):
    """Qwen3-ASR's decode products at 1100 cache rows read 4.5 MB, past kPastL2PrefetchMinBytes:
    the first 16 (or 32) calls alternate plain and prefetching variants (gemv_prefetch.h) and every call
    must give the first call's bits; at 100 rows (0.4 MB) no call is sampled."""
    k, n = (128, 1100) if trans_b else (1100, 128)
    out = run_check(check, 8, 2, k, n, "--trans-b", str(trans_b), "--rounds", str(PREFETCH_CALLS_TO_DECIDE + 4))
    assert out["kernel_calls"] == 1 and out["rounds_equal_first"] is True, out
    assert_prefetch_decided(out["prefetch"])
    distance = out["prefetch_distance"]  # sampled only among the prefetching calls not sampled above
    assert distance["state"] == prefetch_state_expected(distance), distance
    if out["prefetch"]["state"] == "off":
        assert distance["samples_on"] == distance["samples_off"] == 0, distance
    small = run_check(check, 8, 2, *((128, 100) if trans_b else (100, 128)), "--trans-b", str(trans_b), "--rounds", "3")
    assert small["prefetch"]["samples_on"] == small["prefetch"]["samples_off"] == 0, small
    assert small["prefetch"]["state"] == "undecided" and small["rounds_equal_first"] is True, small


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("trans_b", [1, 0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fp16_cache_rows_run_the_stream_kernels_within_the_summation_bound(check, shape, trans_b, threads):
    """A K/V cache of fp16 rows (kv_cache.h KvRows::Fp16) reaches the overwrite as 2-byte bits:
    the stream kernels widen them on load (exact), so against the built-in over the same values
    in float32 the fp32 bound holds, and the weighted sums are the fused chain over those values."""
    out = run_check(check, *shape, "--trans-b", str(trans_b), "--threads", str(threads), "--seed", "5", "--fp16-cache")
    assert out["fp16_cache"] is True
    assert_kernel_within_bound(out, shape, chain=trans_b == 0)


def matmul_label() -> str:
    """The MatMul a run names on this CPU (matmul_layer_label): the weighted sums' 16-lane copy
    where it has AVX-512F."""
    return "ncnnport-avx512" if "avx512f" in cpu_flags() else "ncnnport-avx2"


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["fp32", "fp16"])
@pytest.mark.parametrize("trans_b", [1, 0])
def test_stream_kernels_give_the_same_bits_in_either_register_width(check, trans_b, cache, tmp_path):
    """The weighted sums' 16-lane copy keeps each output the AVX2 copy's fused chain, so both give
    the same bits over every shape (J through whole 128-wide tiles, narrower ones and the scalar
    rest; weight rows in pairs and a last one); so do the many-row kernels' two copies (fp32 rows
    only: fp16 rows past the stream kernels go to the built-in). Each names the copy that ran. On
    a CPU without AVX-512F both runs are the AVX2 copy."""
    fp16 = ["--fp16-cache"] if cache == "fp16" else []
    for shape in SHAPES + (MANY if cache == "fp32" else []):
        runs = {isa: run_check(check, *shape, "--trans-b", str(trans_b), "--seed", "11", *fp16, *extra,
                               "--dump", str(tmp_path / f"{isa}.bin"))
                for isa, extra in {"default": [], "avx2": ["--avx2"]}.items()}
        assert runs["default"]["isa"] == matmul_label() and runs["avx2"]["isa"] == "ncnnport-avx2", runs
        assert all(r["kernel_calls"] == 1 for r in runs.values()), runs
        assert (tmp_path / "default.bin").read_bytes() == (tmp_path / "avx2.bin").read_bytes(), (shape, trans_b, cache)


@pytest.mark.slow
@pytest.mark.parametrize("trans_b", [1, 0])
def test_fp16_cache_rows_past_the_stream_kernels_are_widened_for_the_builtin(check, trans_b):
    """More query rows than the stream kernels take (MLA's 32): the built-in reads only floats,
    so the overwrite hands it B widened and gives the built-in's bits over the same values."""
    out = run_check(check, 1, 32, 64, 100, "--trans-b", str(trans_b), "--fp16-cache")
    assert out["kernel_calls"] == 0 and out["bit_equal"] and out["fp16_cache"], out


@pytest.mark.slow
@pytest.mark.parametrize("trans_b", [1, 0])
def test_more_query_rows_than_the_kernel_takes_stay_on_the_builtin(check, trans_b):
    out = run_check(check, 2, MAX_ROWS + 1, 16, 33, "--trans-b", str(trans_b))
    assert out["kernel_calls"] == 0 and out["bit_equal"], out


@pytest.mark.slow
def test_check_refuses_a_bad_command_line(check):
    res = subprocess.run([str(check), "--heads", "0", "--m", "1", "--k", "1", "--n", "1"], capture_output=True,
                         text=True, timeout=60, check=False)
    assert res.returncode == 2 and "--heads" in res.stderr


def thp_mode() -> str | None:
    """The bracketed setting of /sys/kernel/mm/transparent_hugepage/enabled, None without THP."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


@pytest.mark.slow
def test_qwen3_asr_json_names_the_matmul_and_huge_pages_and_ids_do_not_change(built_cpp, package, speech, tmp_path):
    exe = built_cpp(BUILD / "ncnnport-qwen3-asr", "NCNNPORT_CPP_BUILD")
    base = [str(exe), "--package", str(package("qwen3-asr")), "--audio", str(speech), "--max-new-tokens", "24"]
    ours = run_exe([*base, "--json-out", str(tmp_path / "ours.json"), "--huge-pages"])
    plain = run_exe([*base, "--json-out", str(tmp_path / "plain.json"), "--ncnn-matmul"])
    assert [c["token_ids"] for c in ours["chunks"]] == [c["token_ids"] for c in plain["chunks"]]
    mine, theirs = ours["timing"], plain["timing"]
    assert theirs["matmul"] == "ncnn" and theirs["matmul_calls"] == 0 and theirs["matmul_many_rows"] is False
    assert mine["matmul_many_rows"] is (mine["matmul"] != "ncnn")  # AVX2 and FMA: 16 or 8 lanes
    if mine["matmul"] == "ncnn":
        pytest.skip("this CPU lacks AVX2 / FMA: the MatMul overwrite is not registered")
    assert mine["matmul"] == matmul_label()
    # every decode step runs two attention products (scores, weighted values) per layer
    assert mine["matmul_calls"] >= 2 * mine["decode_steps"] > 0
    # the per-graph seconds split the decode: the head and every decode layer ran and were timed
    graphs = mine["graph_s"]
    assert graphs["lm_head"] > 0 and all(graphs.get(f"decode_layer{i}", 0) > 0 for i in range(2))
    assert sum(s for name, s in graphs.items() if name.startswith("decode_layer")) < mine["decode_s"]
    # the K/V cache sits on its own huge-page mappings (huge_page_allocator.h), whichever MatMul
    # reads it; the attention's prefetch choice is reported per product
    assert mine["kv_cache_huge_peak_bytes"] > 0 and theirs["kv_cache_huge_peak_bytes"] > 0
    assert set(mine["attention_prefetch"]) == {"scores", "weighted"}
    # and each one's distance choice (near first), whose state follows its pairs
    assert set(mine["attention_prefetch_distance"]) == {"scores", "weighted"}
    for product, d in mine["attention_prefetch_distance"].items():
        assert d["state"] == prefetch_state_expected(d), (product, d)

    off, on = theirs["huge_pages"], mine["huge_pages"]
    assert off["enabled"] is False and off["collapsed_bytes"] == 0 and off["advised_bytes"] == 0
    assert on["enabled"] is True
    assert on["collapsed_bytes"] % (2 << 20) == 0 and on["advised_bytes"] % (2 << 20) == 0, on


@pytest.mark.slow
def test_qwen3_asr_fp16_cache_rows_are_the_same_numbers_in_two_or_four_bytes(built_cpp, package, speech, tmp_path):
    """Under fp16-storage the cache holds fp16 rows: 2-byte bits read by the overwrite, or the same
    values as floats for ncnn's MatMul (--ncnn-matmul). Same numbers, so the same ids; the 2-byte
    cache holds half the bytes."""
    exe = built_cpp(BUILD / "ncnnport-qwen3-asr", "NCNNPORT_CPP_BUILD")
    base = [str(exe), "--package", str(package("qwen3-asr")), "--audio", str(speech), "--max-new-tokens", "24",
            "--precision", "fp16-storage"]
    ours = run_exe([*base, "--json-out", str(tmp_path / "ours.json")])
    plain = run_exe([*base, "--json-out", str(tmp_path / "plain.json"), "--ncnn-matmul"])
    assert [c["token_ids"] for c in ours["chunks"]] == [c["token_ids"] for c in plain["chunks"]]
    mine, theirs = ours["timing"], plain["timing"]
    assert mine["kv_cache_rows"] == theirs["kv_cache_rows"] == "fp16"
    assert theirs["kv_cache_value_bytes"] == 4
    if mine["matmul"] == "ncnn":
        pytest.skip("this CPU lacks AVX2 / FMA: the MatMul overwrite is not registered")
    assert mine["kv_cache_value_bytes"] == 2 and mine["matmul_calls"] >= 2 * mine["decode_steps"] > 0
    assert 0 < mine["kv_cache_huge_peak_bytes"] < theirs["kv_cache_huge_peak_bytes"]


@pytest.mark.slow
def test_huge_page_step_backs_a_resident_buffer_or_says_why_not(built_cpp):
    """64 MiB allocated as ncnn allocates weights and filled: its whole 2 MiB frames (all but at
    most one at either end) end on huge pages, or the step names the refusal and, where THP is
    not off, at least advised every frame."""
    exe = built_cpp(BUILD / "ncnnport-huge-pages-check", "NCNNPORT_CPP_BUILD")
    res = subprocess.run([str(exe), "--mib", "64"], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    frames = out["buffer_bytes"] - 2 * (2 << 20)
    if out["collapsed_bytes"] >= frames:
        assert out["anon_huge_pages_after"] - out["anon_huge_pages_before"] >= frames, out
    else:  # refused: the step names why, and advised what it could not collapse (where THP is on)
        assert out["error"], out
        if thp_mode() not in (None, "never"):
            assert out["collapsed_bytes"] + out["advised_bytes"] >= frames, out
