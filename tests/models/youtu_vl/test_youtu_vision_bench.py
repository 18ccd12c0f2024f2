"""The per-layer vision bench: the work it times is the pipeline's, and its estimates are honest."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ncnnport.models.youtu_vl import vision_bench as vb
from ncnnport.models.youtu_vl.config import VisionConfig, tiny_config
from ncnnport.parity.budgets import INT8_RMS_RATIO


REAL = VisionConfig()


def test_cases_follow_the_official_resize_and_window_layout() -> None:
    big = vb.case_for("1024x1024", REAL)
    assert big.grid_hw == (64, 64) and big.patches == 4096
    assert len(big.windows) == 16 and {b - a for a, b in big.windows} == {256}
    small = vb.case_for("448x448", REAL)  # 28x28 patches: 14 merged tokens a side -> 8 + 6
    assert small.grid_hw == (28, 28)
    assert [b - a for a, b in small.windows] == [256, 192, 192, 144]
    cap = vb.case_for("cap", REAL)
    assert cap.patches == vb.CAP_PATCHES and len(cap.windows) == 144
    assert vb.case_for("4000x4000", REAL).patches <= vb.CAP_PATCHES  # the resize rule applies the cap


def test_bad_size_is_one_clear_error(capsys) -> None:
    with pytest.raises(ValueError, match="use HxW pixels"):
        vb.case_for("big", REAL)
    with pytest.raises(SystemExit) as exit_info:  # checked before anything is built or converted
        vb.main(["--sizes", "448x448,big"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("vision bench size 'big': use HxW pixels "
                                                                   "(e.g. 1024x1024) or 'cap'")


def test_encoder_counts_every_block_of_the_real_tower() -> None:
    assert vb.layer_counts(REAL) == (23, 4)
    assert vb.encoder_ms(10.0, 100.0, REAL) == 23 * 10.0 + 4 * 100.0


def _row(size: str, patches: int, windows: int, win: float, full: float) -> dict:
    return {"size": size, "patches": patches, "windows": windows, "extrapolated": False,
            "peak_rss_mb": {"after_ncnn": 600.0, "after_torch": 800.0},
            "window_ms": {"ncnn": win, "torch": 2 * win, "ratio": 2.0},
            "full_ms": {"ncnn": full, "torch": 3 * full, "ratio": 3.0}}


def test_extrapolation_adds_only_the_attention_pairs_a_full_layer_has_and_is_labelled() -> None:
    """Model: a layer is 0.01 ms per patch (Gemms) + 1e-6 ms per query-key pair. Timed at 1024,
    the estimate at the cap must recover the model exactly, for both layer kinds."""
    big, cap = vb.case_for("1024x1024", REAL), vb.case_for("cap", REAL)
    cost = lambda case, pairs: 0.01 * case.patches + 1e-6 * pairs  # noqa: E731
    full, win = vb.attention_pairs(big)
    row = _row("1024x1024", big.patches, 16, cost(big, win), cost(big, full))
    est = vb.extrapolate(cap, big, row)
    cap_full, cap_win = vb.attention_pairs(cap)
    assert est["extrapolated"] and est["peak_rss_mb"] is None
    assert est["window_ms"]["ncnn"] == pytest.approx(cost(cap, cap_win))
    assert est["full_ms"]["ncnn"] == pytest.approx(cost(cap, cap_full))
    line = vb.table([row, est], REAL, threads=1)[-1]
    assert "cap (extrapolated)" in line and "| - |" in line


def test_extrapolation_takes_the_pairs_from_the_one_at_a_time_window_layer() -> None:
    """With the windows side by side, ncnn's window layer is faster than the same Gemms run one
    window at a time, as the full layer runs them: a full layer is the serial window layer plus
    its extra attention pairs. Model as above, the side-by-side window layer 1.6x faster: the
    estimate at the cap recovers the model's full layer, and the window layer's side-by-side
    time scaled."""
    big, cap = vb.case_for("1024x1024", REAL), vb.case_for("cap", REAL)
    cost = lambda case, pairs: 0.01 * case.patches + 1e-6 * pairs  # noqa: E731
    full, win = vb.attention_pairs(big)
    row = _row("1024x1024", big.patches, 16, cost(big, win) / 1.6, cost(big, full))
    row["serial_ms"] = {"ncnn": cost(big, win), "gain": 1.6}
    est = vb.extrapolate(cap, big, row)
    cap_full, cap_win = vb.attention_pairs(cap)
    assert est["window_ms"]["ncnn"] == pytest.approx(cost(cap, cap_win) / 1.6)
    assert est["full_ms"]["ncnn"] == pytest.approx(cost(cap, cap_full))
    del row["serial_ms"]  # the side-by-side time as the base instead: the full layer comes out wrong
    assert vb.extrapolate(cap, big, row)["full_ms"]["ncnn"] != pytest.approx(cost(cap, cap_full), rel=1e-3)


def test_verdict_is_judged_on_the_whole_encoder() -> None:
    rows = [_row("a", 784, 4, 100.0, 100.0)]  # torch 2x on windows, 3x on full layers
    line = vb.table(rows, REAL, threads=1)[-1]
    ratio = (23 * 200 + 4 * 300) / (23 * 100 + 4 * 100)
    assert f"| {ratio:.2f} | - | met |" in line


def _parity(window_ok: bool) -> dict:
    gate = vb.layer_gate(vb.bench_precision("bf16"))
    ok = {"max_abs_rel": 0.01, "worst_row_cosine": 0.9999, "passed": True, "reason": ""}
    bad = {**ok, "max_abs_rel": 2 * gate.max_abs_rel, "passed": False, "reason": "max_abs"}
    return {"window": ok if window_ok else bad, "full": ok}


def test_speed_bought_outside_the_parity_gate_is_not_met() -> None:
    fast = {**_row("a", 784, 4, 100.0, 100.0), "parity": _parity(window_ok=False)}
    line = vb.table([fast], REAL, threads=1, precision="bf16")[-1]
    assert "| bf16 |" in line and "FAIL" in line and "| not met (parity: window layer outside the gate) |" in line
    fine = {**fast, "parity": _parity(window_ok=True)}
    assert vb.verdict(fine, REAL) == "met"
    slow = {**_row("a", 784, 4, 100.0, 100.0), "window_ms": {"ncnn": 100.0, "torch": 100.0, "ratio": 1.0},
            "full_ms": {"ncnn": 100.0, "torch": 100.0, "ratio": 1.0}, "parity": _parity(window_ok=True)}
    assert vb.verdict(slow, REAL) == "not met"


def test_precision_is_an_ncnn_option_judged_by_the_policy_mode() -> None:
    assert vb.layer_gate(vb.bench_precision("fp32")).max_abs_rel == pytest.approx(1e-4)
    bf16 = vb.layer_gate(vb.bench_precision("bf16"))  # the roundoff rule's: 2 x 4 x 2^-8
    assert bf16.max_abs_rel == pytest.approx(2 * 4 * 2 ** -8)
    with pytest.raises(ValueError, match="derived package"):
        vb.bench_precision("fp16-weights")
    int8 = vb.layer_gate(vb.bench_precision("int8-weights"))  # the blocks rewritten, judged by int8's gate
    assert int8.max_abs_rel == pytest.approx(bf16.max_abs_rel * INT8_RMS_RATIO)


def test_a_package_precision_is_refused_before_anything_is_built(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        vb.main(["--precision", "fp16-weights", "--build", str(tmp_path / "b")])
    assert exit_info.value.code == 2 and not (tmp_path / "b").exists()
    assert "derived package (package-fp16w)" in capsys.readouterr().err.strip().splitlines()[-1]


def test_encoder_ratio_pairs_the_calls_of_one_round() -> None:
    """Round 1 ran under load (all four calls 10x slower: its ratio is unchanged) and round 2 only
    during torch's full layer: the median of per-round ratios is the quiet ratio."""
    times = [[10.0, 100.0, 10.0], [20.0, 200.0, 20.0], [100.0, 1000.0, 100.0], [300.0, 3000.0, 3000.0]]
    got = vb.encoder_round_ratio(times, REAL)
    quiet = vb.encoder_ms(20.0, 300.0, REAL) / vb.encoder_ms(10.0, 100.0, REAL)
    assert got == pytest.approx(quiet)
    row = {**_row("a", 784, 4, 10.0, 100.0), "encoder_ratio": got}
    assert f"| {got:.2f} | - | met |" in vb.table([row], REAL, threads=1)[-1]


def test_ncnn_layer_equals_the_reference_block_on_every_window(tmp_path) -> None:
    """Tiny widths, real window layout (a 12x18 grid: two unequal windows): the ncnn graph run
    once per window and the full-attention graph over all patches match the reference blocks."""
    cfg = dataclasses.replace(tiny_config().vision)
    tower, graphs = vb.build_graphs(cfg, tmp_path)
    small = vb.two_block_config(cfg)
    runners = vb.open_runners(graphs, small, threads=1)
    case = vb.case_for("192x288", cfg)
    assert [b - a for a, b in case.windows] == [192, 24]
    inputs = vb.rope_inputs(case, cfg, np.random.default_rng(1))
    blocks = tower.vision_model.encoder.layers
    whole = ((0, case.patches),)
    for kind, block, spans in (("window", blocks[0], case.windows), ("full", blocks[1], whole)):
        got = vb.ncnn_layer_call(runners[kind], inputs, spans)()[0]
        want = vb.torch_layer_call(block, inputs, spans)().numpy()
        assert np.abs(got - want).max() < 1e-4, kind
    row = vb.measure_case(case, tower, runners, cfg, rounds=1)
    assert row["windows"] == 2 and row["peak_rss_mb"]["after_torch"] >= row["peak_rss_mb"]["after_ncnn"] > 0
    assert all(p["passed"] and p["max_abs_rel"] < 1e-4 for p in row["parity"].values())
    assert row["serial_ms"]["ncnn"] > 0 and row["serial_ms"]["gain"] > 0


def test_window_layer_on_two_threads_runs_its_windows_side_by_side(tmp_path) -> None:
    """On 2 threads the window block is loaded for one thread per window, two windows at a time
    (the pipeline's window segments); the serial copy keeps both threads on one window. Both
    compute the same layer."""
    from ncnnport.runtime.concurrent_calls import CallSplit

    cfg = dataclasses.replace(tiny_config().vision)
    _, graphs = vb.build_graphs(cfg, tmp_path)
    runners = vb.open_runners(graphs, vb.two_block_config(cfg), threads=2)
    assert runners["window"].split == CallSplit(2, 1) and runners["window_serial"].split == CallSplit(1, 2)
    assert runners["full"].split == CallSplit(1, 2)
    case = vb.case_for("192x288", cfg)
    inputs = vb.rope_inputs(case, cfg, np.random.default_rng(1))
    side = vb.ncnn_layer_call(runners["window"], inputs, case.windows)()
    one = vb.ncnn_layer_call(runners["window_serial"], inputs, case.windows)()
    np.testing.assert_allclose(side, one, rtol=0, atol=1e-5 * np.abs(one).max())


@pytest.mark.parametrize("name,least_error", [("bf16", 1e-3), ("int8-weights", 1e-5)])
def test_reduced_precision_layers_are_judged_against_the_fp32_torch_block(tmp_path, name, least_error) -> None:
    """bf16 storage, or the blocks' Gemms rewritten to int8, on the same tiny graphs: the error
    lands inside that precision's gate and far above fp32's roundoff (fp32 reads ~1e-7), so the
    parity column measures the precision and can fail. bf16 storage also rounds the residual
    stream, which dominates a block's output: it fails fp32's 1e-4 gate; int8 rounds only the
    projections' inputs and weights (measured 4e-5 here, 3e-4 at the real widths)."""
    cfg = dataclasses.replace(tiny_config().vision)
    tower, graphs = vb.build_graphs(cfg, tmp_path)
    small = vb.two_block_config(cfg)
    runners = vb.open_runners(graphs, small, threads=1, precision=name)
    if name == "int8-weights":  # the int8 copies beside the fp32 graphs, which stay as they were
        assert sorted(p.name for p in tmp_path.glob("*.int8w.ncnn.param")) == [
            "vision_block_full.int8w.ncnn.param", "vision_block_window.int8w.ncnn.param"]
    case = vb.case_for("192x288", cfg)
    reduced = vb.measure_case(case, tower, runners, cfg, rounds=1, gate=vb.layer_gate(vb.bench_precision(name)))
    assert all(p["passed"] for p in reduced["parity"].values()), reduced["parity"]
    strict = vb.measure_case(case, tower, runners, cfg, rounds=1, gate=vb.layer_gate(vb.bench_precision("fp32")))
    assert min(p["max_abs_rel"] for p in strict["parity"].values()) > least_error


def test_bench_perf_times_the_whole_encoder_only_where_a_call_takes_seconds() -> None:
    """A whole 1024x1024 encoder call is minutes per runtime here, and bench-perf repeats it 23
    times per runtime: those sizes are declared as timed per layer, never silently dropped."""
    from ncnnport.models.youtu_vl import bench

    assert bench.PERF_STAGES["vision_encoder"] == ["448x448"]
    vision = [t for t in bench.PERF_TARGETS if t.stage == "vision_encoder"]
    assert {t.size for t in vision} == {"448x448", "1024x1024", "cap (36864 patches)"}
    assert all(("vision_bench" in t.unmeasured) == (t.size != "448x448") for t in vision)
