import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.metrics import compare, judge
from ncnnport.parity.records import token_record


def test_identical_tensors_pass():
    a = np.random.default_rng(0).standard_normal((1, 7, 16)).astype(np.float32)
    stats = compare(a, a.copy())
    assert stats.max_abs == 0 and stats.cosine == 1.0
    assert judge(stats, Tolerance())[0]


def test_one_bad_row_is_caught_by_worst_row_cosine():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 500, 64)).astype(np.float32)
    b = a.copy()
    b[0, 123] = rng.standard_normal(64)
    stats = compare(a, b)
    assert stats.cosine > 0.99          # the global cosine hides it
    assert stats.worst_row_cosine < 0.5
    passed, reason = judge(stats, Tolerance(min_cosine=0.99, max_abs_rel=10.0))
    assert not passed and "worst-row" in reason


def test_nan_fails_and_is_counted():
    a = np.ones((1, 4), np.float32)
    b = a.copy()
    b[0, 2] = np.nan
    stats = compare(a, b)
    assert stats.nan == 1
    assert not judge(stats, Tolerance())[0]


def test_max_abs_gate_is_relative_to_reference_scale():
    a = np.full((1, 4), 1000.0, np.float32)
    b = a + 0.05  # 5e-5 relative: inside 1e-4 x max|ref|
    assert judge(compare(a, b), Tolerance(min_cosine=0.0))[0]
    assert not judge(compare(a, a + 0.5), Tolerance(min_cosine=0.0))[0]


def test_shape_mismatch_is_an_error():
    import pytest
    with pytest.raises(ValueError, match="shape"):
        compare(np.zeros((1, 3)), np.zeros((1, 4)))


def test_token_mismatch_reports_reference_margin():
    logits = [np.array([0.0, 3.0, 1.0]), np.array([2.0, 1.99, 0.0])]
    rec = token_record("clip", [1, 0], [1, 1], logits)
    assert rec["first_mismatch"] == 1 and rec["tokens_matched"] == 1
    assert abs(rec["margin_at_mismatch"] - 0.01) < 1e-9
    assert not rec["passed"]
    ok = token_record("clip", [1, 0], [1, 0], logits, min_tokens=2)
    assert ok["passed"] and ok["first_mismatch"] is None
    assert not token_record("clip", [1], [1], logits, min_tokens=2)["passed"]


def test_a_run_with_no_e2e_records_does_not_pass(toy_package, tmp_path):
    """run_parity must not report PASSED when the model's e2e hook compared nothing."""
    from types import SimpleNamespace

    from ncnnport.package.manifest import write_manifest
    from ncnnport.fsutil import write_json
    from ncnnport.parity.policy import Policy
    from ncnnport.drivers.parity import run_parity
    import shutil

    pkg = tmp_path / "pkg"
    shutil.copytree(toy_package["dir"], pkg / "ncnn")
    write_json(pkg / "specs" / "toy.spec.json", toy_package["record"])
    write_manifest(pkg, model="toy", source="test", config_hash="-", build_key="-", commands=[])
    spec = toy_package["spec"]
    port = SimpleNamespace(e2e_parity=lambda ctx: [])
    prep = SimpleNamespace(target=SimpleNamespace(model="toy", preset="tiny", ckpt=None), specs=[spec],
                           port=port, loaded=None, policy=Policy.load(None), timings={})
    summary = run_parity(prep, pkg)
    assert all(r["passed"] for r in summary["modules"]) and summary["e2e"] == []
    assert not summary["gates_passed"]
    assert run_parity(prep, pkg, skip_e2e=True)["gates_passed"]


def test_noise_relative_gate_follows_the_measured_reference_noise():
    import pytest

    from ncnnport.parity.records import noise_relative_tolerance, stage_record

    base = Tolerance(min_cosine=0.999, max_abs_rel=1e-4, max_abs_floor=1e-6)
    ref = np.linspace(-10, 10, 101)
    cand = ref.copy()
    cand[50] += 5e-3  # 2.5e-4 of max|ref|: above the fixed relative gate (1e-3 absolute)
    assert not stage_record("f", "logits", ref, cand, base)["passed"]
    # the reference's own fp32 error on this input was 2e-3: 4x that admits 5e-3 ...
    assert stage_record("f", "logits", ref, cand, noise_relative_tolerance(base, 2e-3, 4.0))["passed"]
    # ... but not when the reference was quiet (the base gate stays the floor) ...
    assert noise_relative_tolerance(base, 1e-9, 4.0) == base
    assert not stage_record("f", "logits", ref, cand, noise_relative_tolerance(base, 1e-4, 4.0))["passed"]
    # ... and an unmeasured noise is an error, never a pass
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError):
            noise_relative_tolerance(base, bad, 4.0)


def test_worst_row_cosine_follows_the_feature_axis():
    """Video (B, C, T, H, W): rows are channel vectors. Along W (2 pixels) a near-zero pair of
    values at rounding noise reads as a bad "row"; per channel vector it does not, while a
    really corrupted channel vector is still caught."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((1, 8, 3, 4, 2))
    ref[0, 0, 1, 2, :] = 1e-5  # one W-row of channel 0 with tiny values (other channels normal)
    noisy = ref + rng.standard_normal(ref.shape) * 1e-7
    assert compare(ref, noisy).worst_row_cosine < 0.999999           # W rows: a false alarm
    assert compare(ref, noisy, feature_axis=1).worst_row_cosine > 0.999999
    bad = noisy.copy()
    bad[0, :, 2, 1, 0] = rng.standard_normal(8)                       # one pixel's channel vector
    assert compare(ref, bad, feature_axis=1).worst_row_cosine < 0.9
    with __import__("pytest").raises(ValueError, match="feature_axis 5"):
        from ncnnport.contract import TensorSpec
        TensorSpec("y", (1, 8, "t", "h", "w"), feature_axis=5)
