"""``ncnnport bench-cpp`` (ncnnport/drivers/cpp_bench.py): the report's structure and its
verdicts, never its timings.

Fast tests feed the row builders hand-made runs (a mismatch of ids must be reported, the overhead
verdict must follow the target, the interleaving must rotate), and drive the generic driver with a
fake port (its ``cpp_bench_cases`` hook and a stand-in executable): the driver knows no model, a
port without the hook is refused in one line. Slow tests run the real bench on the tiny presets
with small prompts: C++ and Python token ids equal in every round, the prompt lengths as asked,
SeedVR2's frames compared.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pytest
import torch

from ncnnport.drivers import cpp_bench, torch_ratio
from ncnnport.drivers.cpp_bench import DecodeRun, ImageRun
from ncnnport.lazy_weights import Init, LazyModel, SeededSource, empty_module, materialize, parameter_shapes
from ncnnport.registry import KNOWN_MODELS, CppBenchCase, E2EContext, LoadedModel, ModelPort

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))


def run(runtime: str, ids, decode_s=0.3, graph_s=None, prompt=100) -> DecodeRun:
    return DecodeRun(runtime, prompt, list(ids), decode_s, len(ids) - 1, graph_s)


def test_interleaving_pairs_each_rotation_with_its_reverse():
    order: list[str] = []
    calls = {n: (lambda n=n: order.append(n) or n) for n in ("a", "b", "c")}
    out = cpp_bench.interleaved_runs(calls, rounds=3)
    assert order == ["a", "b", "c", "c", "b", "a", "b", "c", "a"]
    assert out == {"a": ["a"] * 3, "b": ["b"] * 3, "c": ["c"] * 3}


def test_decode_row_reports_per_token_ms_overhead_and_id_agreement():
    ids = [5, 6, 7, 8]
    runs = {"cpp": [run("cpp", ids, 0.30, 0.291), run("cpp", ids, 0.33, 0.32), run("cpp", ids, 0.36, 0.35)],
            "python": [run("python", ids, 0.45)] * 3, "torch": [run("torch", [5, 6, 9, 9], 0.9)] * 3}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    assert row["cpp"]["per_token_ms"] == {"median": pytest.approx(110.0), "min": pytest.approx(100.0),
                                          "max": pytest.approx(120.0), "rounds": pytest.approx([100.0, 110.0, 120.0])}
    assert row["python_over_cpp"]["median"] == pytest.approx(150 / 110)  # the median of per-round ratios
    assert row["cpp"]["overhead"]["median"] == pytest.approx(0.009 / 0.30)  # rounds: 3.0 %, 3.03 %, 2.78 %
    assert row["overhead_met"] and row["ids_cpp_equal_python"] and row["forced_length"]
    assert row["torch_ids_equal_cpp"] == [False] * 3
    table = cpp_bench.markdown({"new_tokens": 4, "rows": [row], "rounds": 3,
                                "load_average": {"before": [1.0], "after": [2.0]}}, "machine: x")
    assert "| P=100 | 100 | 110.0 (100.0-120.0) |" in table and "met | yes |" in table


def test_bound_columns_judge_the_cpp_token_against_85_percent():
    """bound = token weight bytes / read bandwidth; each runtime's per-token median as a share
    of it, and the issue-17 verdict on the C++ loop only."""
    ids = [5, 6, 7, 8]
    runs = {"cpp": [run("cpp", ids, 0.30, 0.29)] * 3, "python": [run("python", ids, 0.45)] * 3}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_bound(row, token_weight_bytes=2_000_000_000, read_gbps=20.0)  # bound 100 ms
    assert row["bound"]["bound_ms"] == pytest.approx(100.0)
    assert row["cpp"]["pct_of_bound"] == pytest.approx(100 * 100 / 100.0)  # 0.30 s / 3 steps
    assert row["python"]["pct_of_bound"] == pytest.approx(100 * 100 / 150.0) and row["bound"]["cpp_met"]
    slow = cpp_bench.decode_row("P=100", {"cpp": [run("cpp", ids, 0.36, 0.35)] * 3,
                                          "python": [run("python", ids, 0.45)] * 3}, new_tokens=4)
    cpp_bench.add_bound(slow, 2_000_000_000, 20.0)
    assert slow["cpp"]["pct_of_bound"] == pytest.approx(100 * 100 / 120.0) and not slow["bound"]["cpp_met"]
    lines = "\n".join(cpp_bench.bound_lines({"rows": [row, slow], "threads": 1}))
    assert "2000 MB of fp32 weights per token" in lines and "= 100.00 ms per token" in lines
    assert "| P=100 | 100% | 67% | - | met | - |" in lines and "| P=100 | 83% | 67% | - | not met | - |" in lines
    unknown = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_bound(unknown, None, 20.0)
    assert "bound" not in unknown and cpp_bench.bound_lines({"rows": [unknown], "threads": 1}) == []


def test_the_python_loops_kv_bound_counts_its_float32_rows():
    """Under a precision with fp16 rows the C++ cache streams 2 bytes per value and the Python
    cache, which keeps them as float32, 4: each loop's "incl. K/V" counts its own."""
    ids = [5, 6, 7, 8]
    runs = {"cpp": [run("cpp", ids, 0.30, 0.29)] * 3, "python": [run("python", ids, 0.45)] * 3}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_bound(row, 2_000_000_000, 20.0, "fp16-storage", kv_bytes_per_position=2_450_000,
                        python_kv_bytes_per_position=4_900_000)
    assert row["bound"]["kv_bytes"] == 249_900_000  # the C++ cache's
    assert row["cpp"]["pct_of_bound_with_kv"] == pytest.approx(100 * (100 + 12.495) / 100.0)
    assert row["python"]["pct_of_bound_with_kv"] == pytest.approx(100 * 124.99 / 150.0)


def test_the_cpp_kv_bound_counts_the_width_the_executable_stored():
    """Where the executable's JSON says its cache stored 4-byte rows (no F16C, bf16 storage,
    --ncnn-matmul) under a precision that asks for fp16 rows, "incl. K/V" counts 4 bytes, not the
    2 the precision would give; 2 where it said 2."""
    timing = {"decode_s": 0.3, "decode_steps": 3, "decode_graph_s": 0.29, "kv_cache_value_bytes": 4}
    out = {"chunks": [{"prompt_tokens": 100, "token_ids": [5, 6, 7, 8], "stopped_by_eos": False}], "timing": timing}
    assert cpp_bench.cpp_decode_run(out, "exe").kv_value_bytes == 4
    assert cpp_bench.cpp_decode_run({**out, "timing": {k: v for k, v in timing.items() if k != "kv_cache_value_bytes"}},
                                    "exe").kv_value_bytes is None
    ids = [5, 6, 7, 8]
    for stored, cpp_kv in ((4, 4_900_000), (2, 2_450_000)):
        cpp = [DecodeRun("cpp", 100, ids, 0.30, 3, 0.29, False, stored)] * 3
        row = cpp_bench.decode_row("P=100", {"cpp": cpp, "python": [run("python", ids, 0.45)] * 3}, new_tokens=4)
        assert row["cpp"]["kv_cache_value_bytes"] == stored
        cpp_bench.add_bound(row, 2_000_000_000, 20.0, "fp16-storage", kv_bytes_per_position=2_450_000,
                            python_kv_bytes_per_position=4_900_000)
        assert row["bound"]["kv_bytes"] == cpp_kv * 102 and row["bound"]["kv_bytes_from"] == "executable"
        assert row["cpp"]["pct_of_bound_with_kv"] == pytest.approx(100 * (100 + cpp_kv * 102 / 20e6) / 100.0)
        assert row["python"]["pct_of_bound_with_kv"] == pytest.approx(100 * 124.99 / 150.0)


def test_each_weight_stream_is_reported_with_its_read_speed_and_the_prefetch_states():
    """timing.weight_streams (every one-row kernel call by width and bytes per call) becomes one
    line per row: each stream's median GB/s over the rounds and its share of the read bandwidth,
    with the prefetch state each round ended in (and, when on, the distance it ended on: near unless
    the distance choice is on); a run without the record prints no line."""
    def out(head_gbps: float, state: str, far: str = "off") -> dict:
        streams = {"fp16": [{"bytes": 4 << 20, "calls": 20, "seconds": 0.0056, "gbps": 15.0},
                            {"bytes": 300 << 20, "calls": 5, "seconds": 0.1, "gbps": head_gbps}], "fp32": [], "int8": []}
        timing = {"decode_s": 0.3, "decode_steps": 3, "decode_graph_s": 0.29, "weight_streams": streams,
                  "gemv_prefetch": {"fp32": {"state": "undecided"}, "fp16": {"state": state}, "int8": {"state": "undecided"}},
                  "gemv_prefetch_distance": {"fp16": {"state": far}}}
        return {"chunks": [{"prompt_tokens": 100, "token_ids": [5, 6, 7, 8], "stopped_by_eos": False}], "timing": timing}
    cpp = [cpp_bench.cpp_decode_run(out(g, st, far), "exe")
           for g, st, far in ((16.0, "off", "off"), (18.0, "on", "off"), (17.0, "on", "on"))]
    assert cpp[0].weight_streams[1] == {"width": "fp16", "bytes": 300 << 20, "calls": 5, "seconds": 0.1, "gbps": 16.0}
    row = cpp_bench.decode_row("P=100", {"cpp": cpp, "python": [run("python", [5, 6, 7, 8], 0.45)] * 3}, new_tokens=4)
    assert row["cpp"]["weight_streams"] == [{"width": "fp16", "bytes": 4 << 20, "calls": [20, 20, 20], "gbps": 15.0},
                                            {"width": "fp16", "bytes": 300 << 20, "calls": [5, 5, 5], "gbps": 17.0}]
    cpp_bench.add_bound(row, 2_000_000_000, 20.0)
    lines = "\n".join(cpp_bench.bound_lines({"rows": [row], "threads": 1}))
    assert ("- P=100: fp16 4.0 MiB x 20: 15.0 GB/s (75 %), fp16 300 MiB x 5: 17.0 GB/s (85 %) "
            "(fp16 prefetch off/on-near/on-far)") in lines, lines
    plain = cpp_bench.decode_row("P=100", {"cpp": [run("cpp", [5, 6, 7, 8], 0.3, 0.29)] * 3,
                                           "python": [run("python", [5, 6, 7, 8], 0.45)] * 3}, new_tokens=4)
    cpp_bench.add_bound(plain, 2_000_000_000, 20.0)
    assert "weight_streams" not in plain["cpp"]
    assert "one-row kernel reads" not in "\n".join(cpp_bench.bound_lines({"rows": [plain], "threads": 1}))


def test_the_bound_with_the_kv_cache_is_reported_beside_the_weights_bound():
    """With the cache bytes per position, each ncnn loop is also reported against weights + the
    cache at the steps' mean length (prompt + new / 2); the verdict stays the weights' bound's."""
    ids = [5, 6, 7, 8]
    runs = {"cpp": [run("cpp", ids, 0.30, 0.29)] * 3, "python": [run("python", ids, 0.45)] * 3}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    # 2000 MB of weights at 20 GB/s = 100 ms; 100 prompt + 4 / 2 = 102 positions of 4.9 MB = 499.8 MB
    cpp_bench.add_bound(row, 2_000_000_000, 20.0, kv_bytes_per_position=4_900_000)
    assert row["bound"]["mean_cache_length"] == pytest.approx(102.0)
    assert row["bound"]["kv_bytes"] == 499_800_000
    assert row["cpp"]["pct_of_bound"] == pytest.approx(100.0) and row["bound"]["cpp_met"]
    assert row["cpp"]["pct_of_bound_with_kv"] == pytest.approx(100 * 124.99 / 100.0)
    assert row["python"]["pct_of_bound_with_kv"] == pytest.approx(100 * 124.99 / 150.0)
    lines = "\n".join(cpp_bench.bound_lines({"rows": [row], "threads": 1}))
    assert "| P=100 | 100% | 67% | - | met | 499.8 (102) | 125% | 83% |" in lines
    assert cpp_bench.KV_NOTE in lines
    plain = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_bound(plain, 2_000_000_000, 20.0)
    assert "kv_bytes" not in plain["bound"] and "pct_of_bound_with_kv" not in plain["cpp"]
    assert "| P=100 | 100% | 67% | - | met | - | - | - |" in "\n".join(cpp_bench.bound_lines({"rows": [plain], "threads": 1}))


def test_the_bound_of_fp16_storage_counts_2_byte_inner_product_weights():
    """add_bound records the precision's InnerProduct width (runtime/precision.py: 2 under fp16
    storage) beside the bytes the port counted, and the bound table says which weights were
    counted at which width; fp32 keeps its wording."""
    ids = [5, 6, 7, 8]
    runs = {"cpp": [run("cpp", ids, 0.15, 0.14)] * 3, "python": [run("python", ids, 0.3)] * 3}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_bound(row, token_weight_bytes=1_000_000_000, read_gbps=20.0, precision="fp16-storage")
    assert row["bound"]["bound_ms"] == pytest.approx(50.0)
    assert (row["bound"]["precision"], row["bound"]["inner_product_weight_bytes"]) == ("fp16-storage", 2)
    assert row["cpp"]["pct_of_bound"] == pytest.approx(100.0) and row["bound"]["cpp_met"]
    lines = "\n".join(cpp_bench.bound_lines({"rows": [row], "threads": 1}))
    assert "1000 MB of weights (fp16-storage: InnerProduct weights at 2 bytes, the rest at 4) per token" in lines
    fp32 = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_bound(fp32, 2_000_000_000, 20.0)
    assert fp32["bound"]["inner_product_weight_bytes"] == 4
    # torch eager runs fp32 beside an fp16 ncnn run: it is judged against the fp32 bytes it reads
    with_torch = {**runs, "torch": [run("torch", ids, 0.3)] * 3}
    half = cpp_bench.decode_row("P=100", with_torch, new_tokens=4)
    cpp_bench.add_bound(half, 1_000_000_000, 20.0, "fp16-storage", fp32_weight_bytes=2_000_000_000)
    assert half["cpp"]["pct_of_bound"] == pytest.approx(100.0)  # 50 ms bound, 50 ms per token
    assert half["torch"]["pct_of_bound"] == pytest.approx(100.0)  # 100 ms fp32 bound, 100 ms per token
    assert "Torch (fp32) against its own: 2000 MB = 100.00 ms." in "\n".join(
        cpp_bench.bound_lines({"rows": [half], "threads": 1}))
    assert "2000 MB of fp32 weights per token" in "\n".join(cpp_bench.bound_lines({"rows": [fp32], "threads": 1}))


def test_flatness_is_the_token_at_the_longest_prompt_over_the_shortest():
    """Issue 17 item 2 on the shipped loop: C++ median ms/token at the longest prompt over the
    shortest, <= 1.1; reported under the bound table and in the JSON; no verdict from one size."""
    ids = [5, 6, 7, 8]

    def row(label: str, prompt: int, decode_s: float, spread: float = 0.0) -> dict:
        runs = {"cpp": [run("cpp", ids, decode_s + d, decode_s + d, prompt) for d in (-spread, 0.0, spread)],
                "python": [run("python", ids, 0.3, prompt=prompt)] * 3}
        r = cpp_bench.decode_row(label, runs, new_tokens=4)
        cpp_bench.add_bound(r, 1_000_000_000, 20.0)
        return r

    flat = cpp_bench.flatness([row("P=1000", 1000, 0.315), row("P=100", 100, 0.3)])
    assert (flat["short"], flat["long"], flat["met"]) == ("P=100", "P=1000", True)
    assert flat["ratio"] == pytest.approx(1.05) and flat["ci"] == pytest.approx([1.05, 1.05])
    steep = cpp_bench.flatness([row("P=100", 100, 0.3), row("P=1000", 1000, 0.36, spread=0.03)])
    # per-round ratios 1.1, 1.2, 1.3: their median, and with 3 rounds the whole range (75 % coverage)
    assert steep["ratio"] == pytest.approx(1.2) and not steep["met"] and steep["rounds"] == 3
    assert steep["ci"] == pytest.approx([1.1, 1.3]) and steep["ci_coverage"] == pytest.approx(0.75)
    lines = "\n".join(cpp_bench.bound_lines({"rows": [row("P=100", 100, 0.3)], "threads": 1, "flatness": steep}))
    assert ("Flat in context: C++ ms/token at P=1000 / at P=100 = 1.20 [1.10, 1.30] (median of 3 per-round "
            "ratios, the sizes interleaved round by round; 75 % interval; target <= 1.1: not met).") in lines
    assert cpp_bench.flatness([row("P=100", 100, 0.3)]) is None


def test_flatness_judges_the_decode_layers_where_the_executable_reports_them():
    """Item 2 is the per-layer cost: with timing.decode_layers_s the verdict is the layers' graphs'
    ratio (here 0.10 -> 0.13 s: 1.30, not met) while the whole token, whose head reads the same
    bytes at every length, reads 1.10; the token's ratio is printed beside it."""
    ids = [5, 6, 7, 8]

    def row(label: str, prompt: int, decode_s: float, layers_s: float) -> dict:
        cpp = DecodeRun("cpp", prompt, ids, decode_s, len(ids) - 1, decode_s, decode_layers_s=layers_s)
        out = {"chunks": [{"token_ids": ids, "prompt_tokens": prompt, "stopped_by_eos": False}],
               "timing": {"decode_s": decode_s, "decode_steps": len(ids) - 1, "decode_graph_s": decode_s,
                          "decode_layers_s": layers_s}}
        assert cpp_bench.cpp_decode_run(out, "exe").decode_layers_s == layers_s
        for bad in (-0.01, decode_s * 1.01):  # not a share of the decode graphs' time
            with pytest.raises(cpp_bench.BenchError, match="decode_layers_s"):
                cpp_bench.cpp_decode_run({**out, "timing": {**out["timing"], "decode_layers_s": bad}}, "exe")
        r = cpp_bench.decode_row(label, {"cpp": [cpp] * 3, "python": [run("python", ids, 0.3, prompt=prompt)] * 3},
                                 new_tokens=4)
        cpp_bench.add_bound(r, 1_000_000_000, 20.0)
        return r

    flat = cpp_bench.flatness([row("P=100", 100, 0.30, 0.10), row("P=1000", 1000, 0.33, 0.13)])
    assert flat["measured"] == "layers" and flat["ratio"] == pytest.approx(1.3) and not flat["met"]
    assert flat["token_ratio"] == pytest.approx(1.1)
    lines = "\n".join(cpp_bench.bound_lines({"rows": [row("P=100", 100, 0.30, 0.10)], "threads": 1, "flatness": flat}))
    assert "Flat in context: the C++ decode layers' graphs' ms/token at P=1000 / at P=100 = 1.30" in lines
    assert "not met). The whole token (embedding and head included): 1.10." in lines
    assert "split_ms" not in flat and "weight streams +" not in lines  # the executables did not say
    # one row without the layers' time: the token's ratio, as before
    old = row("P=100", 100, 0.30, 0.10)
    del old["cpp"]["layers_ms_per_token"]
    assert cpp_bench.flatness([old, row("P=1000", 1000, 0.33, 0.13)])["measured"] == "token"


def test_flatness_says_whether_the_longer_cache_cost_went_to_the_streams_or_the_rest():
    """With timing.decode_layers_stream_s the line splits the layers' ms per token into the
    weights' streams and the rest: here the streams take 24 ms at both lengths (3 steps) and the
    rest grows from 6 to 12 ms, so the whole growth is outside the streams: +20 % of P=100's 30."""
    ids = [5, 6, 7, 8]

    def row(label: str, prompt: int, layers_s: float, streams_s: float | None) -> dict:
        timing = {"decode_s": 0.5, "decode_steps": 3, "decode_graph_s": 0.4, "decode_layers_s": layers_s}
        if streams_s is not None:
            timing["decode_layers_stream_s"] = streams_s
        out = {"chunks": [{"token_ids": ids, "prompt_tokens": prompt, "stopped_by_eos": False}], "timing": timing}
        cpp = cpp_bench.cpp_decode_run(out, "exe")
        return cpp_bench.decode_row(label, {"cpp": [cpp] * 2, "python": [run("python", ids, 0.3, prompt=prompt)] * 2},
                                    new_tokens=4)

    short, long = row("P=100", 100, 0.090, 0.072), row("P=1000", 1000, 0.108, 0.072)
    assert short["cpp"]["layers_rest_ms_per_token"]["median"] == pytest.approx(6.0)
    flat = cpp_bench.flatness([short, long])
    assert flat["ratio"] == pytest.approx(1.2)
    assert flat["split_ms"] == {"streams": pytest.approx([24.0, 24.0]), "rest": pytest.approx([6.0, 12.0])}
    said = cpp_bench.split_sentence(flat)
    assert "P=100 24.0 + 6.0, P=1000 24.0 + 12.0" in said
    assert "added +0.0 ms in the streams (+0 %) and +6.0 ms in the rest (+20 %)" in said
    # a row whose executable does not split: no split, the ratio as before
    assert "split_ms" not in cpp_bench.flatness([short, row("P=1000", 1000, 0.108, None)])
    # layers whose weights no one-row kernel streamed (Gemm layers, Vulkan): the streams
    # read 0, and a split would call the weights' reads "attention, norms, rope"; so none
    ncnn_weights = cpp_bench.flatness([row("P=100", 100, 0.090, 0.0), row("P=1000", 1000, 0.108, 0.0)])
    assert ncnn_weights["ratio"] == pytest.approx(1.2) and "split_ms" not in ncnn_weights
    assert cpp_bench.split_sentence(ncnn_weights) == ""
    # a streams' share larger than the layers' time was not measured as one
    for bad in (-0.001, 0.090 + 1e-6, 0.2):  # a microsecond past the layers' time is not the counter's step
        with pytest.raises(cpp_bench.BenchError, match="decode_layers_stream_s"):
            row("P=100", 100, 0.090, bad)
    assert row("P=100", 100, 0.090, 0.090)["cpp"]["layers_rest_ms_per_token"]["median"] == pytest.approx(0.0)


def test_a_differing_id_or_a_large_overhead_is_reported():
    runs = {"cpp": [run("cpp", [1, 2, 3], 0.2, 0.1)] * 3, "python": [run("python", [1, 2, 4], 0.2)] * 3}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=3)
    assert not row["ids_cpp_equal_python"]
    assert row["id_mismatches"] == [{"round": i, "first_difference": 2} for i in range(3)]
    assert cpp_bench.ids_cell(row) == "NO (from token 2)"
    assert row["cpp"]["overhead"]["median"] == pytest.approx(0.5) and not row["overhead_met"]
    short = {"cpp": [run("cpp", [1, 2], 0.2, 0.19)], "python": [run("python", [1, 2], 0.2)]}
    assert not cpp_bench.decode_row("P=100", short, new_tokens=3)["forced_length"]


def test_a_flip_is_reported_with_the_python_loops_top2_margin_there():
    """Where the ids part, the Python loop's logits at that step (asked once per position) give
    the flip's top-2 margin, the margin over the C++ token and the logits' scale, in the JSON and
    in the ids cell; without the hook the cell names the position alone."""
    cpp_ids, py_ids = [5, 6, 7, 9], [5, 6, 7, 8]
    runs = {"cpp": [run("cpp", cpp_ids, 0.3, 0.29)] * 2, "python": [run("python", py_ids, 0.45)] * 2}
    row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    asked = []

    def logits_at(k: int) -> np.ndarray:
        asked.append(k)
        out = np.zeros(12, dtype=np.float32)
        out[8], out[9], out[3] = 6.5, 6.4985, -7.0  # Python's 8 over C++'s 9 by 0.0015
        return out

    cpp_bench.add_flip_margins(row, runs, logits_at)
    assert asked == [3]  # once for both rounds
    m = row["id_mismatches"][0]
    assert m["python_top2_margin"] == pytest.approx(0.0015, abs=1e-6)
    assert m["python_margin_over_cpp_token"] == pytest.approx(0.0015, abs=1e-6)
    assert m["python_logit_scale"] == pytest.approx(7.0) and m["cpp_took_python_runner_up"]
    assert cpp_bench.ids_cell(row) == "NO (from token 3: Python top-2 margin 0.0015 of logits up to 7, C++ took the runner-up)"
    plain = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_flip_margins(plain, runs, None)
    assert cpp_bench.ids_cell(plain) == "NO (from token 3)"
    # a rerun that does not repeat the timed run's token there gives no margin, and says so
    other = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    cpp_bench.add_flip_margins(other, runs, lambda k: np.eye(12)[9])
    assert "python_top2_margin" not in other["id_mismatches"][0]
    assert cpp_bench.ids_cell(other) == "NO (from token 3: the Python loop's rerun chose 9 there, not its timed run's token)"
    # logits too short for the ids are refused, naming the row and the token
    short = cpp_bench.decode_row("P=100", runs, new_tokens=4)
    with pytest.raises(cpp_bench.BenchError, match="P=100: the Python loop's logits at token 3 have 5 values"):
        cpp_bench.add_flip_margins(short, runs, lambda k: np.zeros(5))


def test_a_flip_is_judged_as_the_models_policy_judges_tokens_in_the_precision():
    """fp32 (the policy's tokens exact): any flip fails the row. fp16 (teacher-forced): a flip on a
    near tie passes, the bound being 2 x the policy's derived propagated logits budget at the
    logits' scale (qwen3-asr: margin 2 x kappa 56 x 2^-11 relative); a clear margin, or a flip without a
    margin, still fails."""
    from ncnnport.parity.policy import Policy

    policy = Policy.load(ROOT / "models" / "qwen3_asr" / "policy.json")
    assert cpp_bench.ids_gate(policy, "fp32", False, "logits")["tokens"] == "exact"
    gate = cpp_bench.ids_gate(policy, "fp16-storage", False, "logits")
    assert gate["tokens"] == "near_tie" and gate["mode"] == "fp16"
    assert gate["max_abs_rel"] == pytest.approx(2 * 56 * 2.0 ** -11)
    assert cpp_bench.ids_gate(policy, "fp32", True, "logits")["mode"] == "vulkan_fp32"  # teacher-forced there
    assert cpp_bench.ids_gate(None, "fp16-storage", False, "logits")["tokens"] == "exact"
    assert cpp_bench.ids_gate(policy, "int8-weights", False, "logits")["tokens"] == "reported"

    runs = {"cpp": [run("cpp", [5, 6, 7, 9], 0.3, 0.29)] * 2, "python": [run("python", [5, 6, 7, 8], 0.45)] * 2}

    def judged(second: float, precision: str, logits: bool = True) -> dict:
        row = cpp_bench.decode_row("P=100", runs, new_tokens=4)
        top = np.zeros(12, dtype=np.float32)
        top[8], top[9], top[3] = 6.5, second, -7.0
        cpp_bench.add_flip_margins(row, runs, (lambda k: top) if logits else None)
        cpp_bench.judge_flips(row, cpp_bench.ids_gate(policy, precision, False, "logits"))
        return row

    near = judged(6.4985, "fp16-storage")
    bound = 2 * (2 * 56 * 2.0 ** -11) * 7.0  # the near-tie factor x (margin x kappa x u) x scale
    assert near["ids_passed"] and near["id_mismatches"][0]["verdict"] == "near-tie"
    assert near["id_mismatches"][0]["near_tie_bound"] == pytest.approx(bound)
    assert cpp_bench.ids_cell(near) == ("NO (from token 3: Python top-2 margin 0.0015 of logits up to 7, C++ took "
                                        "the runner-up; a near tie, within 0.77), passed as near ties")
    assert cpp_bench.near_tie_lines([near]) == [
        "", "ids: the model's policy judges fp16 tokens teacher-forced, so a C++/Python flip passes on a near tie: "
            "the Python loop's top-2 margin there at most 2 x its logits gate (0.0547 x the logits' max |value|, "
            "derived from the mode's roundoff: parity/budgets.py)."]
    clear = judged(6.5 - 1.2 * bound, "fp16-storage")
    assert not clear["ids_passed"] and clear["id_mismatches"][0]["verdict"] == "hard failure"
    assert cpp_bench.ids_cell(clear).endswith("C++ took the runner-up; NOT a near tie, over 0.77)")
    exact = judged(6.4985, "fp32")
    assert not exact["ids_passed"] and exact["id_mismatches"][0]["verdict"] == "hard failure"
    assert not judged(6.4985, "fp16-storage", logits=False)["ids_passed"]
    reported = judged(6.4985, "int8-weights")  # reported, not gated (IDS_NOT_GATED): no verdict, no excuse
    assert "verdict" not in reported["id_mismatches"][0] and not reported["ids_passed"]
    assert cpp_bench.ids_cell(reported).endswith("C++ took the runner-up)")
    same = cpp_bench.decode_row("P=100", {"cpp": [run("cpp", [5, 6, 7, 8], 0.3, 0.29)], "python": runs["python"][:1]},
                                new_tokens=4)
    cpp_bench.judge_flips(same, cpp_bench.ids_gate(policy, "fp32", False, "logits"))
    assert same["ids_passed"] and cpp_bench.ids_cell(same) == "yes"
    assert cpp_bench.near_tie_lines([same]) == []


def test_a_different_prompt_length_is_a_mismatch():
    runs = {"cpp": [run("cpp", [1, 2], 0.2, 0.19, prompt=100)], "python": [run("python", [1, 2], prompt=99)]}
    assert not cpp_bench.decode_row("P=100", runs, new_tokens=2)["ids_cpp_equal_python"]


def test_image_row_compares_frame_bytes():
    a = np.zeros((1, 4, 4, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0, 0] = 2
    row = cpp_bench.image_row("4x4", {"cpp": [ImageRun("cpp", 1.0, a)] * 3, "python": [ImageRun("python", 2.0, b)] * 3})
    assert not row["frames_cpp_equal_python"]
    assert row["frames_cpp_vs_python"] == {"max_level_difference": 2, "differing_bytes": 1, "total_bytes": 48}
    assert row["python_over_cpp"]["median"] == pytest.approx(2.0)


def test_cpp_result_without_timing_is_one_line():
    with pytest.raises(cpp_bench.BenchError, match="timing.decode_s"):
        cpp_bench.cpp_decode_run({"chunks": [{"token_ids": [1], "prompt_tokens": 3, "stopped_by_eos": False}]}, "x")


def _prepared(model: str, tmp_path, monkeypatch, built_cpp):
    """The tiny target prepared and converted into ``tmp_path``, the executable's folder set."""
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    exe = built_cpp(BUILD / f"ncnnport-{model}", "NCNNPORT_CPP_BUILD")
    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(exe.parent))
    prep = prepare(Target(model, "tiny", None, tmp_path / "build"))
    return prep, convert_stage(prep)


def _bench(model: str, sizes, tmp_path, monkeypatch, built_cpp, new_tokens=6):
    prep, package = _prepared(model, tmp_path, monkeypatch, built_cpp)
    return cpp_bench.bench_target(prep, package, sizes, new_tokens, 2, 1, True, tmp_path / "reports")


@pytest.mark.slow
@pytest.mark.parametrize("torch_runs", [False, True])
def test_no_runtime_holds_its_weights_beside_another(torch_runs, tmp_path, monkeypatch, built_cpp):
    """The reference that export's package cases built whole is dropped before the rounds; no
    case builds it under --no-torch (the P=1000 row was OOM-killed holding it at real widths) and
    each torch call drops it after its tokens; the Python loop's graphs are closed whenever
    another runtime starts."""
    from ncnnport.models.youtu_vl import cpp_bench as youtu_bench

    prep, package = _prepared("youtu-vl", tmp_path, monkeypatch, built_cpp)
    ref = prep.loaded.reference
    assert ref.is_materialized  # the package's e2e cases ran the whole reference
    benches: list[Any] = []
    original = youtu_bench.YoutuVlBench
    monkeypatch.setattr(youtu_bench, "YoutuVlBench", type("Recorded", (original,), {
        "__init__": lambda self, ctx: (original.__init__(self, ctx), benches.append(self))[0]}))
    seen: list[tuple[bool, list[str]]] = []
    report = cpp_bench.run_bench(prep, package, [40], new_tokens=3, rounds=2, torch=torch_runs,
                                 log=lambda _m: seen.append((ref.is_materialized, benches[0].modules.live)))
    assert seen == [(False, [])] * (6 if torch_runs else 4)
    assert report["reference_released"] and report["passed"]
    (row,) = report["rows"]
    assert ("torch" in row) is torch_runs
    assert all(row[name]["peak_rss_mb"]["min"] > 0 for name in cpp_bench.RUNTIMES if name in row)


@pytest.mark.slow
@pytest.mark.parametrize("model,prompt", [("youtu-vl", 40), ("qwen3-asr", 60)])
def test_llm_bench_rows_have_equal_ids(model, prompt, tmp_path, monkeypatch, built_cpp):
    report = _bench(model, [prompt], tmp_path, monkeypatch, built_cpp)
    assert report["passed"] and (tmp_path / "reports" / f"{model}.json").is_file()
    (row,) = report["rows"]
    assert row["ids_cpp_equal_python"], row["id_mismatches"]
    assert prompt - 13 < row["prompt_tokens"] <= prompt  # qwen3-asr: 13 audio tokens per second of audio
    assert row["rounds"] == 2 and set(cpp_bench.RUNTIMES) <= set(row)
    assert 0.0 <= row["cpp"]["overhead"]["median"] < 1.0
    assert len(row["token_ids"]) == 6 or any(row["cpp"]["stopped_by_eos"])


@pytest.mark.slow
@pytest.mark.parametrize("model,prompt", [("qwen3-asr", 60), ("youtu-vl", 40)])
def test_fp16_storage_bench_has_equal_ids_and_a_2_byte_bound(model, prompt, tmp_path, monkeypatch, built_cpp):
    """Both ncnn loops under fp16 storage (the executable says so in its JSON) give the same ids,
    and the bound counts the port's whole-token bytes with 2-byte InnerProduct weights."""
    prep, package = _prepared(model, tmp_path, monkeypatch, built_cpp)
    fp32_bytes = prep.port.bench_bytes(prep.loaded, prep.port.bench_token_stage(), "1")["weights"]
    report = cpp_bench.bench_target(prep, package, [prompt], 6, 2, 1, False, tmp_path / "reports",
                                    precision="fp16-storage")
    (row,) = report["rows"]
    assert report["passed"] and row["ids_cpp_equal_python"], row["id_mismatches"]
    assert report["precision"] == "fp16-storage" and (tmp_path / "reports" / f"{model}-fp16-storage.json").is_file()
    assert row["bound"]["inner_product_weight_bytes"] == 2 and row["bound"]["token_weight_bytes"] < fp32_bytes
    assert "ncnn fp16-storage (torch fp32)" in report["table"]


@pytest.mark.slow
def test_qwen3_asr_token_bytes_count_the_packages_inner_products_at_the_precision_width(tmp_path, monkeypatch,
                                                                                      built_cpp):
    """The bound's fp16 bytes are honest for what ncnn reads: the graphs a token runs hold no
    weight matrix but InnerProducts (no Gemm, Convolution or MatMul with a constant; RMSNorm
    gammas and the one Embed row stay fp32), and fp32 - fp16-storage bytes is exactly 2 bytes per
    InnerProduct weight of those graphs."""
    prep, package = _prepared("qwen3-asr", tmp_path, monkeypatch, built_cpp)
    inner_product = 0
    for param in [*sorted((package / "ncnn").glob("decode_layer*.ncnn.param")), package / "ncnn" / "lm_head.ncnn.param",
                  package / "ncnn" / "embed.ncnn.param"]:
        if ".gpu." in param.name:
            continue
        for line in param.read_text().splitlines()[2:]:
            kind, fields = line.split()[0], dict(f.split("=", 1) for f in line.split() if "=" in f)
            assert kind not in ("Gemm", "Convolution", "Convolution1D", "MemoryData"), (param.name, line)
            if kind == "InnerProduct":
                inner_product += int(fields["2"])
    assert inner_product > 0
    fp32, fp16 = (prep.port.bench_bytes(prep.loaded, "token", "1", p)["weights"] for p in ("fp32", "fp16-storage"))
    assert fp32 - fp16 == 2 * inner_product


def test_each_llm_names_its_whole_token_stage_and_seedvr2_none():
    """bench-cpp's bound counts the bytes of the port's whole-token stage (a stage of its bench,
    counted by its bench_bytes); an LLM without one would print no bound, silently."""
    from ncnnport.registry import get_port

    for model in ("qwen3-asr", "youtu-vl"):
        port = get_port(model)
        assert port.bench_token_stage() in port.bench_stages(), model
    assert get_port("seedvr2").bench_token_stage() is None


@pytest.mark.slow
def test_seedvr2_bench_row_compares_frames(tmp_path, monkeypatch, built_cpp):
    report = _bench("seedvr2", [64], tmp_path, monkeypatch, built_cpp)
    (row,) = report["rows"]
    assert row["case"] == "64x64" and row["frames_stable_across_rounds"]
    assert row["frames_cpp_equal_python"] or row["frames_cpp_vs_python"]["max_level_difference"] <= 2
    assert "| 64x64 |" in report["table"]


def test_bad_options_are_refused_before_anything_is_built(capsys):
    from ncnnport.cli import main

    assert main(["bench-cpp", "qwen3-asr", "--rounds", "0"]) == 2
    assert "need --rounds >= 1" in capsys.readouterr().err


# --- the generic driver over a fake port --------------------------------------------------------

FAKE_EXE = textwrap.dedent("""\
    #!{python}
    import json, sys
    argv = [a for a in sys.argv[1:] if a not in ("--vulkan", "--huge-pages")]  # the flags without a value
    args = dict(zip(argv[0::2], argv[1::2]))
    ids = [int(t) for t in args["--ids"].split(",")]
    huge = "--huge-pages" in sys.argv and "--ignore-huge" not in args
    decode_s = 0.2
    if "--drift-file" in args:  # a machine slowing by --drift per executable run, --scale the size's own cost
        import os
        done = os.path.getsize(args["--drift-file"]) if os.path.exists(args["--drift-file"]) else 0
        open(args["--drift-file"], "a").write("x")
        decode_s = 0.2 * float(args["--scale"]) * (1 + float(args["--drift"])) ** done
    out = {{"chunks": [{{"token_ids": ids, "prompt_tokens": int(args["--prompt"]), "stopped_by_eos": False}}],
           "timing": {{"decode_s": decode_s, "decode_steps": len(ids) - 1, "decode_graph_s": 0.95 * decode_s,
                      "precision": args.get("--ran", args.get("--precision", "fp32")),
                      "huge_pages": {{"enabled": huge}}}}}}
    open(args["--json-out"], "w").write(json.dumps(out))
    # live a few of ChildPeak's 20 ms periods: a run that ends between two samples is read as the
    # one sample it got, which can be the interpreter just after exec (1.6 MB under CI load)
    import time; time.sleep(0.15)
    """)


class NoBenchPort(ModelPort):
    """A port with a C++ executable but no C++ bench hook."""

    name = "no-bench"
    cpp_executable = "fake-exe"

    def load(self, preset: str, ckpt: Path | None) -> LoadedModel:
        raise AssertionError("bench-cpp must refuse before building the model")

    def module_specs(self, loaded: LoadedModel) -> list:
        return []

    def e2e_parity(self, ctx: E2EContext) -> list:
        return []


class FakeBenchPort(NoBenchPort):
    """A port with the hook: one decode case per size, the ids ``1..size``."""

    name = "fake-bench"
    cpp_bench_sizes = (3,)
    logits_stage = "logits"

    def bench_token_stage(self) -> str | None:
        return "token"

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.contexts: list[Any] = []

    def cpp_bench_cases(self, ctx: Any, sizes: Sequence[int], new_tokens: int) -> Iterator[CppBenchCase]:
        self.seen.append((ctx.package, ctx.threads, list(sizes), new_tokens))
        self.contexts.append(ctx)
        for size in sizes:
            ids = list(range(1, size + 1))
            yield CppBenchCase(f"P={size}", "decode", ["--ids", ",".join(map(str, ids)), "--prompt", "7"],
                               lambda ids=ids: DecodeRun("python", 7, ids, 0.3, len(ids) - 1),
                               lambda ids=ids: DecodeRun("torch", 7, ids, 0.6, len(ids) - 1), {"from_port": size},
                               logits_stage=self.logits_stage)


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    """``no-bench`` and ``fake-bench`` registered; the stand-in executable in a build folder."""
    for port in (NoBenchPort(), FakeBenchPort()):
        module = types.ModuleType(f"fake_port_{port.name.replace('-', '_')}")
        module.PORT = port
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(KNOWN_MODELS, port.name, module.__name__)
    exe = tmp_path / "cpp" / "fake-exe"
    exe.parent.mkdir()
    exe.write_text(FAKE_EXE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(exe.parent))
    return {name: sys.modules[KNOWN_MODELS[name]].PORT for name in ("no-bench", "fake-bench")}


def test_a_port_without_the_hook_is_refused_in_one_line_naming_it(fake_models, capsys):
    from ncnnport.cli import main

    assert main(["bench-cpp", "no-bench"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "no C++ bench for model no-bench" in err[0] and "fake-bench" in err[0]


def test_the_driver_runs_any_port_through_its_hook(fake_models, tmp_path):
    port = fake_models["fake-bench"]
    prep = types.SimpleNamespace(target=types.SimpleNamespace(model="fake-bench", preset="tiny", layers=None),
                                 port=port, loaded=None)
    report = cpp_bench.run_bench(prep, tmp_path / "pkg", [3, 4], new_tokens=4, rounds=2, log=lambda _m: None)
    assert [r["case"] for r in report["rows"]] == ["P=3", "P=4"] and report["passed"]
    assert [r["from_port"] for r in report["rows"]] == [3, 4] and report["new_tokens"] == 4
    row = report["rows"][1]
    assert row["ids_cpp_equal_python"] and row["token_ids"] == [1, 2, 3, 4] and row["prompt_tokens"] == 7
    assert row["cpp"]["per_token_ms"]["median"] == pytest.approx(200 / 3)
    assert row["python_over_cpp"]["median"] == pytest.approx(1.5) and row["torch_ids_equal_cpp"] == [True, True]
    assert port.seen == [(tmp_path / "pkg", 1, [3, 4], 4)]


class DriftPort(FakeBenchPort):
    """The fake port on a machine that slows by ``drift`` per executable run, the longer prompt
    costing ``scale`` x the shorter's per token."""

    name = "fake-bench"

    def __init__(self, drift_file: Path, drift: float, scale: float) -> None:
        super().__init__()
        self.drift_file, self.drift, self.scale = drift_file, drift, scale

    def cpp_bench_cases(self, ctx: Any, sizes: Sequence[int], new_tokens: int) -> Iterator[CppBenchCase]:
        ids = [1, 2, 3]
        for size in sizes:
            scale = self.scale if size == max(sizes) else 1.0
            yield CppBenchCase(f"P={size}", "decode",
                               ["--ids", "1,2,3", "--prompt", str(size), "--drift-file", str(self.drift_file),
                                "--drift", str(self.drift), "--scale", str(scale)],
                               lambda size=size: DecodeRun("python", size, ids, 0.3, len(ids) - 1))


def test_sizes_run_interleaved_so_a_slowing_machine_does_not_move_the_flatness(fake_models, tmp_path, monkeypatch):
    """Item 2's ratio on a machine slowing 3 % per run, the longer prompt truly 1.05x: timed one size
    after the other (the rule before), P=1000's rounds all ran after P=100's and read 1.05 x 1.03^3
    = 1.15, not met. Interleaved, each round's two sizes are one run apart, the order alternating:
    per-round ratios 1.05 x 1.03 and 1.05 / 1.03, median 1.02 (3 rounds: the order that ran
    twice), met."""
    port = DriftPort(tmp_path / "runs", 0.03, 1.05)
    monkeypatch.setattr(sys.modules[KNOWN_MODELS["fake-bench"]], "PORT", port)
    prep = types.SimpleNamespace(target=types.SimpleNamespace(model="fake-bench", preset="tiny", layers=None),
                                 port=port, loaded=None)
    seen: list[str] = []
    report = cpp_bench.run_bench(prep, tmp_path / "pkg", [3, 30], new_tokens=3, rounds=3, torch=False, log=seen.append)
    cpp_runs = [m.split(":")[0] for m in seen if m.endswith(": cpp")]
    assert cpp_runs == ["fake-bench P=3", "fake-bench P=30", "fake-bench P=30", "fake-bench P=3",
                        "fake-bench P=30", "fake-bench P=3"]  # a rotation, its reverse, the next rotation
    flat = report["flatness"]
    assert flat["measured"] == "token" and flat["rounds"] == 3
    assert flat["ratio"] == pytest.approx(1.05 / 1.03) and flat["met"]
    assert flat["ci"] == pytest.approx([1.05 / 1.03, 1.05 * 1.03])
    # 3 rounds over 2 sizes: P=30 went first in 2, P=3 in 1, and the median (1.05 / 1.03) is the
    # order that ran twice; the report says so, where 4 rounds would read 2 of 4
    assert flat["long_first"] == 2 and [r["rotation"]["position"] for r in report["rows"]] == [0, 1]
    said = cpp_bench.order_sentence(flat)
    assert said.startswith(" P=30 ran first in 2 of 3 rounds (unbalanced") and "even --rounds" in said
    assert cpp_bench.order_sentence({**flat, "rounds": 4, "long_first": 2}) == " P=30 ran first in 2 of 4 rounds."
    # the same runs, but P=30's three after P=3's three (the rule before): every per-round ratio
    # then spans three runs of drift, and the same judge reads 1.05 x 1.03^3 = 1.15, not met
    short, long = ([cpp_bench.DecodeRun("cpp", p, [1, 2, 3], 0.2 * s * 1.03 ** k, 2, 0.19 * s * 1.03 ** k)
                    for k in ks] for p, s, ks in ((3, 1.0, (0, 1, 2)), (30, 1.05, (3, 4, 5))))
    py = [cpp_bench.DecodeRun("python", 0, [1, 2, 3], 0.3, 2)] * 3
    blocks = cpp_bench.flatness([cpp_bench.decode_row("P=3", {"cpp": short, "python": py}, 3),
                                 cpp_bench.decode_row("P=30", {"cpp": long, "python": py}, 3)])
    assert blocks["ratio"] == pytest.approx(1.05 * 1.03 ** 3) and not blocks["met"]


@pytest.mark.parametrize("sizes, why", [("100,100", "given once"), ("100,0", "positive"), ("100,x", "integers")])
def test_bad_sizes_are_refused_in_one_line_before_the_model_loads(fake_models, capsys, sizes, why):
    from ncnnport.cli import main

    assert main(["bench-cpp", "fake-bench", "--sizes", sizes]) == 2  # fake-bench's load() would raise
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0] and f"--sizes {sizes}" in err[0] and why in err[0], err


def test_cases_with_one_label_are_refused_before_any_run(fake_models, tmp_path):
    port = fake_models["fake-bench"]
    prep = types.SimpleNamespace(target=types.SimpleNamespace(model="fake-bench", preset="tiny", layers=None),
                                 port=port, loaded=None)
    seen: list[str] = []
    with pytest.raises(cpp_bench.BenchError, match=r"fake-bench: two cases share the label P=3 \(a size given twice\?\)"):
        cpp_bench.run_bench(prep, tmp_path / "pkg", [3, 3], new_tokens=3, rounds=1, log=seen.append)
    assert not [m for m in seen if "round" in m]


@pytest.mark.parametrize("precision", ["fp16-storage", "int8-weights"])
def test_a_logits_stage_the_models_pipeline_lacks_is_refused_before_any_run(fake_models, tmp_path, monkeypatch,
                                                                           precision):
    """Under a policy loaded with the model's stages, a case naming another stage fails in one line
    naming the case and the stage, before the executable or a loop runs (a misspelling would
    otherwise judge flips by the mode's default gate), in every precision (int8 ids are reported,
    not gated, and still checked)."""
    from ncnnport.parity.policy import Policy

    port = fake_models["fake-bench"]
    monkeypatch.setattr(port, "logits_stage", "logit")
    policy = Policy.load(ROOT / "models" / "qwen3_asr" / "policy.json", stages=("log_mel", "logits"))
    prep = types.SimpleNamespace(target=types.SimpleNamespace(model="fake-bench", preset="tiny", layers=None),
                                 port=port, loaded=None, policy=policy)
    seen: list[str] = []
    with pytest.raises(cpp_bench.BenchError, match=r"fake-bench P=3: logits_stage: .*no stage 'logit'"):
        cpp_bench.run_bench(prep, tmp_path / "pkg", [3], new_tokens=3, rounds=1, precision=precision,
                            log=seen.append)
    assert not [m for m in seen if "P=3:" in m], seen
    monkeypatch.setattr(port, "logits_stage", "logits")
    assert cpp_bench.run_bench(prep, tmp_path / "pkg", [3], new_tokens=3, rounds=1, precision=precision,
                               log=lambda _m: None)["rows"]


class TinyLazy(LazyModel):
    """A lazy reference of one Linear: ``full()`` builds it, ``release()`` drops it."""

    def __init__(self) -> None:
        skeleton = empty_module(lambda: torch.nn.Linear(4, 4))
        super().__init__(skeleton, SeededSource(parameter_shapes(skeleton), lambda _n, _s: Init(0.0, 1.0)))

    def _build_full(self) -> torch.nn.Module:
        return materialize(self.skeleton, self.source, "")


@pytest.mark.parametrize("torch_runs", [False, True])
def test_the_driver_drops_a_built_reference_before_the_rounds(fake_models, tmp_path, torch_runs):
    ref = TinyLazy()
    ref.full()
    prep = types.SimpleNamespace(target=types.SimpleNamespace(model="fake-bench", preset="tiny", layers=None),
                                 port=fake_models["fake-bench"], loaded=types.SimpleNamespace(reference=ref))
    seen: list[bool] = []
    report = cpp_bench.run_bench(prep, tmp_path / "pkg", [3], new_tokens=3, rounds=2, torch=torch_runs,
                                 log=lambda _m: seen.append(ref.is_materialized))
    assert report["reference_released"] and seen == [False] * (6 if torch_runs else 4)
    assert not cpp_bench.run_bench(prep, tmp_path / "pkg", [3], new_tokens=3, rounds=1, torch=torch_runs,
                                   log=lambda _m: None)["reference_released"]  # nothing left to drop


def test_every_runtime_row_has_its_peak_rss(fake_models, tmp_path):
    prep = types.SimpleNamespace(target=types.SimpleNamespace(model="fake-bench", preset="tiny", layers=None),
                                 port=fake_models["fake-bench"], loaded=None)
    report = cpp_bench.run_bench(prep, tmp_path / "pkg", [3], new_tokens=3, rounds=2, log=lambda _m: None)
    (row,) = report["rows"]
    for name in cpp_bench.RUNTIMES:  # a Python interpreter (the stand-in executable) is > 5 MB
        assert row[name]["peak_rss_mb"]["min"] > 5, (name, row[name])
    table = cpp_bench.markdown({**report, "rows": [row]}, "machine: x")
    assert re.search(r"P=3: C\+\+ \d+\.\d\d GB, Python ncnn \d+\.\d\d GB, torch \d+\.\d\d GB", table), table


def test_the_driver_names_no_model():
    source = Path(cpp_bench.__file__).read_text(encoding="utf-8").lower()
    names = {n for m in KNOWN_MODELS.values() for n in (m.split(".")[-2], m.split(".")[-2].replace("_", "-"))}
    names |= {"qwen", "youtu", "seedvr"}
    assert not {n for n in names if re.search(rf"\b{re.escape(n)}", source)}


def test_a_bench_case_of_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind 'video'"):
        CppBenchCase("x", "video", [], lambda: None)


# --- on a GPU: --vulkan and --torch-device --------------------------------------------------------

LAVAPIPE = {"index": 0, "name": "llvmpipe (LLVM 15.0.6, 256 bits)", "type": "software", "vendor": "Mesa",
            "driver_version": "1", "label": "software Vulkan (lavapipe)"}


def _fake_prep(port: Any) -> Any:
    return types.SimpleNamespace(target=types.SimpleNamespace(model=port.name, preset="tiny", layers=None),
                                 port=port, loaded=None)


@pytest.fixture
def recorded_argv(monkeypatch) -> list[list[str]]:
    """Every executable command line the driver runs (the stand-in still runs)."""
    seen: list[list[str]] = []
    real = cpp_bench.run_executable

    def recording(exe, argv, json_out, launcher=()):
        seen.append(list(argv))
        return real(exe, argv, json_out, launcher)
    monkeypatch.setattr(cpp_bench, "run_executable", recording)
    return seen


def test_the_cpu_bench_runs_what_it_ran_before(fake_models, tmp_path, recorded_argv):
    """Without the GPU flags: the port's argv as it is, the graphs on the CPU, torch on the CPU,
    the report saying so and the machine line without a device part."""
    port = fake_models["fake-bench"]
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=2, log=lambda _m: None)
    assert recorded_argv == [["--ids", "1,2,3", "--prompt", "7"]] * 2
    (ctx,) = port.contexts
    assert (ctx.vulkan, ctx.torch_device) == (False, "cpu")
    assert (report["backend"], report["vulkan_device"], report["torch_device"]) == ("cpu", None, "cpu")
    assert cpp_bench.devices_text(report) == "" and cpp_bench.report_stem(report) == "fake-bench"
    (row,) = report["rows"]
    assert set(row) >= {"cpp", "python", "torch"} and "stage_seconds" not in row  # decode rows have no stages
    assert "| case | prompt tokens | C++ ms/token | graphs ms/token | Python ncnn ms/token | torch eager ms/token " \
        in cpp_bench.markdown(report, "machine: x")


def test_vulkan_reaches_every_executable_call_and_the_python_graphs(fake_models, tmp_path, recorded_argv,
                                                                    monkeypatch):
    import ncnnport.drivers.bench as drivers_bench

    monkeypatch.setattr(drivers_bench, "vulkan_available", lambda: True)
    monkeypatch.setattr(cpp_bench, "device_record", lambda: dict(LAVAPIPE))
    port = fake_models["fake-bench"]
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=2,
                                 log=lambda _m: None, vulkan=True)
    assert recorded_argv == [["--ids", "1,2,3", "--prompt", "7", "--vulkan"]] * 2
    assert port.contexts[0].vulkan and report["backend"] == "vulkan" and report["vulkan_device"] == LAVAPIPE
    text = cpp_bench.devices_text(report)
    assert text == ("ncnn (C++ and Python) on Vulkan: software Vulkan (lavapipe) (llvmpipe (LLVM 15.0.6, 256 bits), "
                    "software, Mesa driver 1)")
    assert cpp_bench.report_stem(report) == "fake-bench-vulkan"


def test_a_precision_reaches_the_executable_the_python_graphs_and_the_bound(fake_models, tmp_path, recorded_argv,
                                                                          monkeypatch):
    """--precision fp16-storage: the executable gets it (fp32 runs keep their argv), the port's
    Python graphs open under it (BenchContext.precision), the port counts the token's bytes under
    it, the bound records 2-byte InnerProduct weights, the report and its file name say it."""
    port = fake_models["fake-bench"]
    asked: list[tuple[str, str, str]] = []

    def bench_bytes(loaded, stage, size, precision="fp32"):
        asked.append((stage, size, precision))
        return {"weights": 2_000_000_000 if precision == "fp32" else 1_000_000_000, "kv_cache": 1000 * int(size)}
    monkeypatch.setattr(port, "bench_bytes", bench_bytes, raising=False)
    swept: list[int] = []

    def read_bandwidth(size: int) -> dict:
        swept.append(size)
        return {"read_gbps": 10.0 if size >= 1 << 30 else 20.0}  # a larger buffer meets less cache
    monkeypatch.setattr(cpp_bench, "read_bandwidth", read_bandwidth)
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=2,
                                 log=lambda _m: None, precision="fp16-storage")
    # the ncnn loops' bound over a buffer of their token's bytes, torch's over its own (capped at
    # 1 GiB), each measured before and after the rounds
    assert swept == [953 << 20, 1 << 30, 953 << 20, 1 << 30]
    assert recorded_argv == [["--ids", "1,2,3", "--prompt", "7", "--precision", "fp16-storage"]] * 2
    # the ncnn loops' bytes under the precision, torch's fp32 bytes for its own bound, and the
    # cache bytes one position adds under the precision (the C++ rows' width; lengths 2 and 1
    # differenced) and in fp32 (the Python loop's float32 rows)
    assert port.contexts[0].precision == "fp16-storage"
    assert asked == [("token", "1", "fp16-storage"), ("token", "1", "fp32"),
                     ("token", "1", "fp16-storage"), ("token", "2", "fp16-storage"),
                     ("token", "1", "fp32"), ("token", "2", "fp32")]
    (row,) = report["rows"]
    assert row["bound"]["token_weight_bytes"] == 1_000_000_000 and row["bound"]["inner_product_weight_bytes"] == 2
    assert row["bound"]["fp32_weight_bytes"] == 2_000_000_000
    assert row["bound"]["bound_ms"] == pytest.approx(50.0)
    assert row["bound"]["fp32_read_gbps"] == 10.0 and row["bound"]["fp32_bound_ms"] == pytest.approx(200.0)
    assert report["torch_bandwidth"]["probe_bytes"] == 1 << 30 and report["bandwidth"]["probe_bytes"] == 953 << 20
    assert ("Torch (fp32) against its own: 2000 MB at 10.0 GB/s, over 1024 MiB = 200.00 ms."
            in cpp_bench.markdown(report, "machine: x"))
    assert report["precision"] == "fp16-storage" and report["precision_flags"]["fp16_storage"]
    assert not any(v for k, v in report["precision_flags"].items() if k != "fp16_storage")
    assert cpp_bench.report_stem(report) == "fake-bench-fp16-storage" and report["passed"]


def _fake_probe(folder: Path, body: str) -> None:
    """A stand-in ``ncnnport-cpp`` beside the stand-in executable: its read-bandwidth prints ``body``."""
    probe = folder / "ncnnport-cpp"
    probe.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    probe.chmod(probe.stat().st_mode | stat.S_IXUSR)


def test_the_bound_takes_the_fastest_read_the_cpp_probe_included(fake_models, tmp_path, monkeypatch):
    """bench_bandwidth: the Python reductions and the C++ probe's plain and prefetching reads (the
    kernels' distances and half of them); the bound is the fastest, named in the JSON and the
    table; the probe runs at the bench's thread count."""
    port = fake_models["fake-bench"]
    monkeypatch.setattr(cpp_bench, "read_bandwidth", lambda _size: {"numpy_dot_gbps": 20.0, "copy_gbps": 40.0, "read_gbps": 20.0})
    monkeypatch.setattr(port, "bench_bytes", lambda loaded, stage, size, precision="fp32": {"weights": 1_000_000_000},
                        raising=False)
    _fake_probe(tmp_path / "cpp", "assert sys.argv[1:] == ['read-bandwidth', '--threads', '1', '--mib', '953'], sys.argv\n"
                                  "print('{\"plain_gbps\": 18.0, \"prefetch_gbps\": 25.0}')")
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=1, log=lambda _m: None)
    assert report["bandwidth"]["read_gbps"] == 25.0 and report["bandwidth"]["read_by"] == "cpp_stream_prefetch"
    assert report["bandwidth"]["cpp_stream_gbps"] == 18.0 and report["bandwidth"]["numpy_dot_gbps"] == 20.0
    (row,) = report["rows"]
    assert row["bound"]["read_gbps"] == 25.0 and row["bound"]["bound_ms"] == pytest.approx(40.0)
    assert ("25.0 GB/s read bandwidth (measured in this run, 1 thread(s), fastest: cpp_stream_prefetch, "
            "over 953 MiB)" in cpp_bench.markdown(report, "machine: x"))
    # the read at half the kernels' prefetch distances, where it is the fastest, sets it
    _fake_probe(tmp_path / "cpp", "print('{\"plain_gbps\": 18.0, \"prefetch_gbps\": 25.0, \"prefetch_near_gbps\": 27.0}')")
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=1, log=lambda _m: None)
    assert (report["bandwidth"]["read_gbps"], report["bandwidth"]["read_by"]) == (27.0, "cpp_stream_prefetch_near")
    # four streams side by side (the int8 kernel's streamed variant), where the fastest, set it
    _fake_probe(tmp_path / "cpp", "print('{\"plain_gbps\": 18.0, \"prefetch_gbps\": 25.0, \"prefetch_near_gbps\": 27.0, "
                                  "\"streams4_gbps\": 29.0}')")
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=1, log=lambda _m: None)
    assert (report["bandwidth"]["read_gbps"], report["bandwidth"]["read_by"]) == (29.0, "cpp_streams4")
    # a Python reduction faster than the probe still sets it
    monkeypatch.setattr(cpp_bench, "read_bandwidth", lambda _size: {"numpy_dot_gbps": 30.0, "read_gbps": 30.0})
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=1, log=lambda _m: None)
    assert (report["bandwidth"]["read_gbps"], report["bandwidth"]["read_by"]) == (30.0, "numpy_dot")


def test_the_bounds_reads_sweep_a_buffer_of_the_tokens_bytes():
    """probe_bytes: the token's bytes in whole MiB (a cache meets that buffer as it meets the
    token's weights), at least 1 MiB, at most PROBE_MAX_BYTES (past the cache the size no longer
    matters)."""
    assert cpp_bench.probe_bytes(437_000_000) == 416 << 20
    assert cpp_bench.probe_bytes(219_000_000) == 208 << 20
    assert cpp_bench.probe_bytes(5_000_000_000) == torch_ratio.PROBE_MAX_BYTES == 1 << 30
    assert cpp_bench.probe_bytes(1000) == 1 << 20


def test_a_probe_that_gives_no_reading_stops_the_bench(fake_models, tmp_path, monkeypatch):
    port = fake_models["fake-bench"]
    monkeypatch.setattr(cpp_bench, "read_bandwidth", lambda _size: {"read_gbps": 20.0})
    monkeypatch.setattr(port, "bench_bytes", lambda loaded, stage, size, precision="fp32": {"weights": 1_000_000_000},
                        raising=False)
    _fake_probe(tmp_path / "cpp", "print('cannot map the buffer', file=sys.stderr); sys.exit(1)")
    with pytest.raises(cpp_bench.BenchError, match="read-bandwidth gave no reading: cannot map the buffer"):
        cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=1, log=lambda _m: None)


def test_a_result_that_ran_another_precision_is_refused(fake_models, tmp_path):
    """The executable's JSON must say it ran the precision asked for (a build without the option
    would run fp32 and be timed as fp16)."""
    case = CppBenchCase("P=3", "decode", ["--ids", "1,2,3", "--prompt", "7", "--ran", "fp32"],
                        lambda: DecodeRun("python", 7, [1, 2, 3], 0.3, 2))
    exe = tmp_path / "cpp" / "fake-exe"
    with pytest.raises(cpp_bench.BenchError, match="asked for --precision fp16-storage, its result says it ran fp32"):
        cpp_bench.cpp_call(exe, case, tmp_path / "o.json", precision="fp16-storage")()
    assert cpp_bench.cpp_call(exe, case, tmp_path / "o.json")().token_ids == [1, 2, 3]


def test_int8_weights_run_their_package_with_the_executable_in_fp32_flags(fake_models, tmp_path, recorded_argv,
                                                                         monkeypatch):
    """--precision int8-weights is a package's weights (package-int8w): the executable runs it
    without --precision (its JSON says fp32, which is accepted), the Python graphs open under the
    precision's (fp32) flags, the bound counts the InnerProduct weights at 1 byte, and the report
    and its file name say int8-weights. A result that ran fp16 flags is refused."""
    port = fake_models["fake-bench"]
    monkeypatch.setattr(port, "bench_bytes", lambda loaded, stage, size, precision="fp32":
                        {"weights": 1_000_000_000 if precision == "int8-weights" else 4_000_000_000}, raising=False)
    monkeypatch.setattr(cpp_bench, "read_bandwidth", lambda _size: {"read_gbps": 20.0})
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=2,
                                 log=lambda _m: None, precision="int8-weights")
    assert recorded_argv == [["--ids", "1,2,3", "--prompt", "7"]] * 2
    assert port.contexts[0].precision == "int8-weights"
    (row,) = report["rows"]
    assert row["bound"]["inner_product_weight_bytes"] == 1 and row["bound"]["bound_ms"] == pytest.approx(50.0)
    assert report["precision"] == "int8-weights" and not any(report["precision_flags"].values())
    assert cpp_bench.report_stem(report) == "fake-bench-int8-weights" and report["passed"]
    # a package precision's ids are reported, not gated (two ncnn builds round its int8 Gemm apart)
    assert report["ids_gated"] is False and cpp_bench.IDS_NOT_GATED["int8-weights"] in cpp_bench.markdown(report, "h")
    case = CppBenchCase("P=3", "decode", ["--ids", "1,2,3", "--prompt", "7", "--ran", "fp16-storage"],
                        lambda: DecodeRun("python", 7, [1, 2, 3], 0.3, 2))
    with pytest.raises(cpp_bench.BenchError, match="asked for --precision fp32, its result says it ran fp16-storage"):
        cpp_bench.cpp_call(tmp_path / "cpp" / "fake-exe", case, tmp_path / "o.json", precision="int8-weights")()


def test_huge_pages_reach_the_executable_the_python_graphs_and_the_report(fake_models, tmp_path, recorded_argv,
                                                                        monkeypatch):
    """--huge-pages: the executable gets the flag, the port's Python graphs open with
    RuntimeOptions.huge_pages (BenchContext.huge_pages), the report and its file name say it; an
    executable whose JSON does not say it took them is refused."""
    port = fake_models["fake-bench"]
    report = cpp_bench.run_bench(_fake_prep(port), tmp_path / "pkg", [3], new_tokens=3, rounds=2,
                                 log=lambda _m: None, huge_pages=True)
    assert recorded_argv == [["--ids", "1,2,3", "--prompt", "7", "--huge-pages"]] * 2
    assert port.contexts[0].huge_pages and report["huge_pages"]
    assert cpp_bench.report_stem(report) == "fake-bench-huge-pages"
    assert "huge pages" in cpp_bench.heading(report)
    case = CppBenchCase("P=3", "decode", ["--ids", "1,2,3", "--prompt", "7", "--ignore-huge", "1"],
                        lambda: DecodeRun("python", 7, [1, 2, 3], 0.3, 2))
    with pytest.raises(cpp_bench.BenchError, match="asked for --huge-pages, its result does not say it took them"):
        cpp_bench.cpp_call(tmp_path / "cpp" / "fake-exe", case, tmp_path / "o.json", huge_pages=True)()
    image = CppBenchCase("256", "image", [], lambda: None)
    with pytest.raises(cpp_bench.BenchError, match="the image executable does not take it"):
        cpp_bench.cpp_argv(image, False, huge_pages=True)


@pytest.mark.parametrize("argv, expected", [
    (["--huge-pages", "--vulkan"], "--huge-pages backs CPU weights; --vulkan keeps them on the device"),
    (["--precision", "fp16-packed"], "bench-cpp --precision fp16-packed: the C++ executables run fp32, fp16-storage, bf16, int8-weights"),
    (["--precision", "int8-weights", "--vulkan"], "int8-weights is a CPU setting; --vulkan runs fp32"),
    (["--precision", "fp16-storage", "--vulkan"], "fp16-storage is a CPU setting; --vulkan runs fp32"),
])
def test_a_setting_the_executables_do_not_run_is_one_line(fake_models, capsys, argv, expected):
    _one_line_refusal(capsys, ["bench-cpp", "fake-bench", *argv], expected)


def test_the_python_loop_opens_its_graphs_under_the_precision(monkeypatch, tmp_path):
    """bench_kit.ncnn_modules: runtime/precision.py's options of ctx.precision, threads kept."""
    from ncnnport.models import bench_kit
    from ncnnport.runtime import lazy_modules
    from ncnnport.runtime.precision import get

    opened: list[Any] = []
    monkeypatch.setattr(lazy_modules, "open_ncnn_modules", lambda package, options: opened.append(options) or {})
    for name in ("fp32", "fp16-storage"):
        bench_kit.ncnn_modules(bench_kit.BenchContext(None, tmp_path, tmp_path, 2, precision=name))
    assert [o.num_threads for o in opened] == [2, 2]
    assert opened[1] == get("fp16-storage").options(opened[0]) and opened[1].fp16_storage and not opened[0].fp16_storage


def test_the_python_loop_opens_its_graphs_on_vulkan(monkeypatch, tmp_path):
    """bench_kit.ncnn_modules: the same RuntimeOptions(use_vulkan=True) as verify --backend vulkan."""
    from ncnnport.models import bench_kit
    from ncnnport.runtime import lazy_modules

    opened: list[Any] = []
    monkeypatch.setattr(lazy_modules, "open_ncnn_modules", lambda package, options: opened.append(options) or {})
    for vulkan in (False, True):
        bench_kit.ncnn_modules(bench_kit.BenchContext(None, tmp_path, tmp_path, 2, vulkan=vulkan))
    assert [(o.use_vulkan, o.num_threads) for o in opened] == [(False, 2), (True, 2)]


def _one_line_refusal(capsys, argv: list[str], *expected: str) -> None:
    from ncnnport.cli import main

    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    for text in expected:
        assert text in err[0], err[0]


def test_huge_pages_on_an_image_model_is_one_line_before_the_model_loads(capsys, monkeypatch):
    """SeedVR2's image executable takes no --huge-pages: refused from the port's cpp_bench_kind,
    before the model is built (prepare would load it)."""
    import ncnnport.stages as stages

    monkeypatch.setattr(stages, "prepare", lambda *a, **k: pytest.fail("the model was loaded"))
    _one_line_refusal(capsys, ["bench-cpp", "seedvr2", "--huge-pages"], "model seedvr2's image executable does not take it")


def test_vulkan_without_a_device_is_one_line_before_the_model_loads(fake_models, capsys, monkeypatch):
    import ncnnport.drivers.bench as drivers_bench

    monkeypatch.setattr(drivers_bench, "vulkan_available", lambda: False)
    _one_line_refusal(capsys, ["bench-cpp", "fake-bench", "--vulkan"], "--vulkan: ncnn sees no Vulkan device")


def test_vulkan_without_a_vulkan_build_is_one_line(fake_models, capsys, monkeypatch, tmp_path):
    import ncnnport.drivers.bench as drivers_bench

    monkeypatch.setattr(drivers_bench, "vulkan_available", lambda: True)
    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(tmp_path / "nowhere"))
    _one_line_refusal(capsys, ["bench-cpp", "fake-bench", "--vulkan"], str(tmp_path / "nowhere" / "fake-exe"),
                      "make -C", "cpp VULKAN=1")


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl", "fake-bench"])
def test_a_torch_device_the_loop_does_not_serve_is_one_line(model, fake_models, capsys):
    _one_line_refusal(capsys, ["bench-cpp", model, "--torch-device", "cuda"],
                      f"--torch-device cuda: model {model}: its bench-cpp torch loop runs on cpu only")


def test_cuda_missing_is_one_line_before_the_model_loads(capsys, monkeypatch):
    from ncnnport.models.seedvr2.port import SeedVR2Port
    from ncnnport.stages import prepare  # noqa: F401 (imported before the patch below)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("ncnnport.stages.prepare", lambda t: pytest.fail("the model was loaded"))
    assert "cuda" in SeedVR2Port.cpp_bench_torch_devices
    _one_line_refusal(capsys, ["bench-cpp", "seedvr2", "--torch-device", "cuda"], "torch sees no CUDA device")
    _one_line_refusal(capsys, ["bench-cpp", "seedvr2", "--torch-device", "cuda", "--no-torch"], "--no-torch")


def test_cpp_image_result_keeps_its_stage_seconds(monkeypatch):
    """The executable's stages and its graph loading, apart; its host-only seconds left out."""
    frames = np.zeros((1, 2, 2, 3), np.uint8)
    monkeypatch.setattr(cpp_bench, "frames_of", lambda out, exe: frames)
    out = {"seconds": {"total": 5.0, "load_graphs": 1.0, "vae_encode": 0.5, "dit": 2.0, "vae_decode": 1.0,
                       "host_dit": 0.1}}
    run = cpp_bench.cpp_image_run(out, "x")
    assert run.seconds == pytest.approx(4.0)
    assert run.stages == {"vae_encode": 0.5, "dit": 2.0, "vae_decode": 1.0, "load_graphs": 1.0}


def test_image_rows_print_a_per_stage_table_with_graph_loading_apart():
    a = np.zeros((1, 4, 4, 3), np.uint8)
    cpp = [ImageRun("cpp", 3.0, a, {"vae_encode": 0.5, "dit": d, "vae_decode": 1.0, "load_graphs": 0.25})
           for d in (1.0, 1.5, 2.0)]
    py = [ImageRun("python", 4.0, a, {"vae_encode": 0.75, "dit": 2.5, "vae_decode": 1.25})] * 3
    torch_runs = [ImageRun("torch", 6.0, a, {"vae_encode": 1.0, "dit": 4.0, "vae_decode": 2.0})] * 3
    row = cpp_bench.image_row("256x256", {"cpp": cpp, "python": py, "torch": torch_runs})
    assert row["stage_seconds"]["cpp"][2] == {"vae_encode": 0.5, "dit": 2.0, "vae_decode": 1.0, "load_graphs": 0.25}
    report = {"new_tokens": None, "rows": [row], "rounds": 3, "load_average": {"before": [1.0], "after": [1.0]},
              "torch_device": "cuda"}
    table = cpp_bench.markdown(report, "machine: x")
    assert "| case | runtime | vae_encode s | dit s | vae_decode s | load_graphs s |" in table
    assert "| 256x256 | C++ | 0.500 | 1.500 | 1.000 | 0.250 |" in table
    assert "| 256x256 | Python ncnn | 0.750 | 2.500 | 1.250 | - |" in table
    assert "| 256x256 | torch eager cuda | 1.000 | 4.000 | 2.000 | - |" in table
    assert "| torch eager cuda s |" in table


def test_the_heading_names_the_torch_device():
    report = {"backend": "cpu", "torch_device": "cuda:1", "torch_device_name": "NVIDIA H200"}
    assert cpp_bench.devices_text(report) == "torch on cuda:1 (NVIDIA H200)"
    assert cpp_bench.report_stem({**report, "model": "m"}) == "m-torch-cuda1"


VULKAN_BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD") or ROOT / "build" / "cpp-vulkan")


@pytest.mark.slow
@pytest.mark.gpu
def test_seedvr2_bench_on_vulkan(tmp_path, monkeypatch):
    """The whole bench on the Vulkan device (lavapipe here): the executable from the Vulkan build
    (``NCNNPORT_CPP_BUILD``, else build/cpp-vulkan; skipped when absent, like the C++ Vulkan
    tests) and the Python loop both on Vulkan, the device named, the stage table printed."""
    from ncnnport.drivers.bench import vulkan_available
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    if not vulkan_available():
        if os.environ.get("NCNNPORT_REQUIRE_VULKAN") == "1":
            pytest.fail("NCNNPORT_REQUIRE_VULKAN=1 but ncnn sees no Vulkan device")
        pytest.skip("no Vulkan device on this machine")
    if not (VULKAN_BUILD / "ncnnport-seedvr2").is_file():
        pytest.skip(f"{VULKAN_BUILD / 'ncnnport-seedvr2'} not built (make cpp VULKAN=1)")
    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(VULKAN_BUILD))
    prep = prepare(Target("seedvr2", "tiny", None, tmp_path / "build"))
    report = cpp_bench.bench_target(prep, convert_stage(prep), [64], 2, 2, 1, True, tmp_path / "reports", vulkan=True)
    (row,) = report["rows"]
    assert report["backend"] == "vulkan" and report["vulkan_device"]["name"]
    assert "ncnn (C++ and Python) on Vulkan: " + report["vulkan_device"]["label"] in report["table"]
    assert row["frames_stable_across_rounds"]
    assert row["frames_cpp_equal_python"] or row["frames_cpp_vs_python"]["max_level_difference"] <= 2
    assert set(row["stage_seconds"]) == {"cpp", "python", "torch"} and "load_graphs" in row["stage_seconds"]["cpp"][0]
    assert "| 64x64 | C++ |" in report["table"] and (tmp_path / "reports" / "seedvr2-vulkan.md").is_file()


def test_child_peak_is_not_lent_an_earlier_childs_peak():
    """An earlier child reaped during the body raises the lifetime children peak (getrusage);
    that peak is not the sampled child's. The big child allocates ~300 MB and exits unwaited; it
    is reaped inside the body, where a small child runs long enough to be sampled."""
    import subprocess
    import time

    big = subprocess.Popen([sys.executable, "-c", "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096])"])
    while not os.path.exists(f"/proc/{big.pid}/stat") or open(f"/proc/{big.pid}/stat").read().split()[2] != "Z":
        time.sleep(0.01)
    with cpp_bench.ChildPeak() as peak:
        big.wait()  # reaped here: the lifetime children peak jumps to ~300 MB
        subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5)"], check=True)
    assert 0 < peak.peak < 150 << 20, peak.peak / 2**20
