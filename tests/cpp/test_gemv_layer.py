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

from tests.cpp.layer_check import (PREFETCH_CALLS_TO_DECIDE, assert_prefetch_decided, prefetch_state_expected,
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
# the kernel's copies: the default (16 lanes where the CPU has AVX-512F) and the 8-lane AVX2 one
ISAS = {"default": [], "avx2": ["--avx2"]}


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
        assert runs["default"]["isa"] == kernel_label() and runs["avx2"]["isa"] == "ncnnport-avx2"
        first = {isa: {key: out["calls"][0][key] for key in ("out_sha256", "max_abs_diff", "identical", "gemv_calls")}
                 for isa, out in runs.items()}
        assert first["default"] == first["avx2"], (n, k, weights, first)


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp32", "fp16-storage"])
def test_the_prefetch_choice_samples_large_layers_and_changes_no_bits(check, weights):
    """gemv_prefetch.h: the first one-row calls of a layer of >= 4 MiB of weights alternate plain
    and prefetching reads, then the choice is made by the pairs prefetch won (the sequential sign
    test: 8 pairs, or 16 when the first 8 are neither clear); every call, sampled or not, gives the
    same bits for the same input; a small layer (in cache) never samples."""
    n = 2048 if weights == "fp32" else 4096  # x 1024 inputs = 8 MiB of weights either way
    rows = ",".join(["1"] * (PREFETCH_CALLS_TO_DECIDE + 4))
    out = run_check(check, n, 1024, "--rows", rows, "--same-input", "--bias", *WEIGHTS[weights])
    assert_within_bound(out, f"prefetch {weights}")
    assert_prefetch_decided(out["prefetch"])
    assert len({c["out_sha256"] for c in out["calls"]}) == 1
    small = run_check(check, 64, 64, "--rows", "1,1,1", *WEIGHTS[weights])
    assert {k: small["prefetch"][k] for k in ("state", "samples_on", "samples_off", "pairs_won")} == \
        {"state": "undecided", "samples_on": 0, "samples_off": 0, "pairs_won": 0}


MIB = 1 << 20


def run_choice(built_cpp, calls: list[tuple[int, float, float]], min_bytes: int = MIB) -> dict:
    """ncnnport-prefetch-choice-check on scripted calls (bytes, plain GB/s, prefetching GB/s)."""
    tool = built_cpp(BUILD / "ncnnport-prefetch-choice-check", "NCNNPORT_CPP_BUILD")
    text = "".join(f"{b} {plain} {pre}\n" for b, plain, pre in calls)
    res = subprocess.run([str(tool), "--min-bytes", str(min_bytes)], input=text, capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(res.stdout)


@pytest.mark.slow
def test_the_prefetch_choice_pairs_only_calls_of_one_size(built_cpp):
    """Qwen3-ASR's int8 decode layer order (2, 1, 1, 2, 3, 3, 3 MiB): every prefetching sample
    follows a plain sample of the same size, and a real 10 % gain is found."""
    layer = [2 * MIB, MIB, MIB, 2 * MIB, 3 * MIB, 3 * MIB, 3 * MIB]
    out = run_choice(built_cpp, [(b, 10.0, 11.0) for b in layer * 12])
    sampled = [c for c in out["calls"] if c["sample"]]
    for before, call in zip(sampled, sampled[1:]):
        if call["prefetch"]:
            assert not before["prefetch"] and before["bytes"] == call["bytes"], (before, call)
    assert out["report"]["state"] == "on" and out["report"]["samples_on"] == 8, out["report"]


@pytest.mark.slow
def test_an_unclear_first_eight_pairs_take_eight_more(built_cpp):
    """A real 20 % gain with two of the first 8 prefetching calls stalled (6 wins: the 2-core
    Xeon's false 'off') is decided on 16 pairs and kept; with no gain and the same 6 lucky pairs
    the 16 read at most 6 + 0 wins and prefetch stays off; a clear first 8 decides at once."""
    big = 8 * MIB
    stalled = {1, 4}  # pairs whose prefetching call stalls (3 GB/s)
    gain = [(big, 10.0, 3.0 if i in stalled else 12.0) for i in range(16) for _ in (0, 1)]
    out = run_choice(built_cpp, gain, min_bytes=4 * MIB)["report"]
    assert (out["state"], out["samples_on"], out["pairs_won"]) == ("on", 16, 14), out
    lucky = {0, 2, 3, 5, 6, 7}  # 6 of the first 8 read faster by chance, none after
    none = [(big, 10.0, 12.0 if i in lucky else 10.0) for i in range(16) for _ in (0, 1)]
    out = run_choice(built_cpp, none, min_bytes=4 * MIB)["report"]
    assert (out["state"], out["samples_on"], out["pairs_won"]) == ("off", 16, 6), out
    clear = run_choice(built_cpp, [(big, 10.0, 12.0)] * 40, min_bytes=4 * MIB)["report"]
    assert (clear["state"], clear["samples_on"]) == ("on", 8), clear


@pytest.mark.slow
def test_a_size_difference_is_not_read_as_a_prefetch_gain(built_cpp):
    """Small calls slower than large ones whatever the variant: alternating 1 and 3 MiB calls
    never form a pair (the rule before paired them and read the 3 MiB calls' speed as prefetch's),
    and with no difference between the variants the sign test keeps prefetch off."""
    mixed = run_choice(built_cpp, [(MIB, 10.0, 10.0), (3 * MIB, 15.0, 15.0)] * 20)["report"]
    assert mixed["state"] == "undecided" and mixed["samples_on"] == 0, mixed
    same = run_choice(built_cpp, [(3 * MIB, 15.0, 15.0)] * 20)["report"]
    assert same["state"] == "off" and same["pairs_won"] == 0, same


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
    # the prefetch choice of each weight width: sampled pairs, and a state that follows them
    for width, p in timing["gemv_prefetch"].items():
        assert p["state"] == prefetch_state_expected(p), (width, p)


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
