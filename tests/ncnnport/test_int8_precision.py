"""``--precision int8-weights``: its vocabulary entry, package, bound width, policy mode and budget,
and (slow) the mode end to end through ``ncnnport parity qwen3-asr`` on the tiny preset."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ncnnport.parity.budgets import (INT8_BLOCK_CREST, INT8_RMS_RATIO, PERTURBATION_LIMIT, derive,
                                     effective_roundoff)
from ncnnport.parity.policy import Policy
from ncnnport.runtime import precision
from ncnnport.runtime.options import RuntimeOptions

ROOT = Path(__file__).resolve().parents[2]


def test_int8_weights_runs_its_own_package_with_fp32_ncnn_flags() -> None:
    p = precision.get("int8-weights")
    assert (p.mode, p.package_name, p.inner_product_weight_bytes) == ("int8_weights", "package-int8w", 1)
    # the int8 lives in the graphs, not in ncnn options; its decoders keep fp16 K/V rows (on the CPU)
    assert p.options() == RuntimeOptions(fp16_kv_cache=True)
    assert not p.options(RuntimeOptions(use_vulkan=True)).fp16_kv_cache
    assert precision.fp16_kv_rows(RuntimeOptions(), "int8-weights")  # the package alone says so
    assert not precision.fp16_kv_rows(RuntimeOptions(use_vulkan=True), "int8-weights")
    assert not precision.fp16_kv_rows(RuntimeOptions(), "fp16-weights")
    assert precision.of_options(RuntimeOptions()).name == "fp32"  # fp32 flags still read as fp32
    assert precision.get("fp16-weights").package_name == "package-fp16w"
    assert precision.get("bf16").package_name == "package"


def test_int8_roundoff_is_bf16s_scaled_by_the_rms_ratio() -> None:
    """The rule's roundoff for int8 is the relative rounding with int8's rms error: half a step
    over the absmax (1/254) times the block's crest, i.e. bf16's 2^-8 times the rms ratio."""
    assert effective_roundoff("int8_weights") == pytest.approx(INT8_BLOCK_CREST / 254)
    assert math.isclose(effective_roundoff("int8_weights"), INT8_RMS_RATIO * effective_roundoff("bf16"))


@pytest.mark.parametrize("model", ["qwen3_asr", "youtu_vl", "seedvr2"])
def test_every_policy_judges_int8_weights_like_bf16_scaled_by_the_rms_ratio(model: str) -> None:
    policy = Policy.load(ROOT / "models" / model / "policy.json")
    tol = policy.default("int8_weights")
    assert tol == derive(policy.rule, "int8_weights", policy.default("fp32"))
    assert tol.max_abs_rel == pytest.approx(min(INT8_RMS_RATIO * policy.default("bf16").max_abs_rel,
                                                PERTURBATION_LIMIT), rel=0.01)
    assert policy.data["precisions"]["int8_weights"].get("stages") == policy.data["precisions"]["bf16"].get("stages")


def test_block_crest_is_the_expected_absmax_over_rms_of_a_gaussian_128_block() -> None:
    import numpy as np

    x = np.random.default_rng(0).standard_normal((20000, 128))
    crest = float(np.mean(np.abs(x).max(axis=1) / np.sqrt(np.mean(x * x, axis=1))))
    assert crest == pytest.approx(INT8_BLOCK_CREST, rel=0.01)
    assert INT8_RMS_RATIO == pytest.approx(INT8_BLOCK_CREST * 256 / 254)


@pytest.mark.parametrize("model", ["qwen3_asr", "youtu_vl"])
def test_int8_token_gates_are_bf16_gates_scaled_by_the_rms_ratio(model: str) -> None:
    """KL ~ (logit error)^2 and top-1 misses ~ logit error: bf16's gates scaled by the ratio of the
    two grids' rms roundoff, rounded outward (never tighter than the derivation)."""
    policy = Policy.load(ROOT / "models" / model / "policy.json")
    bf16, int8 = policy.token_gate("bf16"), policy.token_gate("int8_weights")
    assert int8["mode"] == bf16["mode"] == "teacher_forced"
    want_top1 = 1 - (1 - bf16["min_top1"]) * INT8_RMS_RATIO
    want_kl = bf16["max_kl_mean"] * INT8_RMS_RATIO ** 2
    assert want_top1 - 0.01 <= int8["min_top1"] <= want_top1
    assert want_kl <= int8["max_kl_mean"] <= want_kl + 0.001


def test_run_from_a_package_refuses_int8_weights_in_one_line(tmp_path, capsys) -> None:
    import numpy as np
    import soundfile

    from ncnnport.cli import main

    audio = tmp_path / "x.wav"
    soundfile.write(audio, np.zeros(1600, np.float32), 16000)
    assert main(["run", "qwen3-asr", "--package", str(tmp_path), "--precision", "int8-weights",
                 "--audio", str(audio)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision int8-weights needs a package converted with int8 weights" in err[0]


@pytest.mark.slow
def test_parity_int8_weights_on_the_tiny_preset(tmp_path) -> None:
    """The int8 package really runs (decode graphs off fp32 level, audio graphs untouched) and
    passes its own budgets: teacher-forced top-1 and KL on every fixture."""
    import shutil

    from ncnnport.cli import main

    build = tmp_path / "build"
    assert main(["parity", "qwen3-asr", "--precision", "int8-weights", "--build-dir", str(build)]) == 0
    pkg = build / "qwen3-asr" / "tiny" / "package-int8w"
    fp32 = pkg.with_name("package")
    for name in ("decode_layer0", "lm_head"):  # int8: about a quarter of the fp32 bytes
        assert (pkg / "ncnn" / f"{name}.ncnn.bin").stat().st_size < 0.3 * (fp32 / "ncnn" / f"{name}.ncnn.bin").stat().st_size
    assert (pkg / "ncnn" / "audio_layer0.ncnn.bin").read_bytes() == (fp32 / "ncnn" / "audio_layer0.ncnn.bin").read_bytes()
    summary = json.loads((build / "reports" / "qwen3-asr" / "summary.json").read_text())
    assert summary["precision"] == "int8_weights" and summary["gates_passed"]
    worst = {}
    for r in summary["modules"]:
        worst[r["name"]] = max(worst.get(r["name"], 0.0), r["max_abs"] / r["ref_absmax"])
    assert worst["decode_layer0"] > 1e-3 and worst["lm_head"] > 1e-3  # int8 ran there
    assert worst["audio_layer0"] < 1e-5 and worst["prefill_layer0"] < 1e-5  # many-row graphs stay fp32
    tokens = [r for r in summary["e2e"] if r.get("stage") == "tokens"]
    assert len(tokens) >= 4 and all(r["gate"]["mode"] == "teacher_forced" and r["passed"] for r in tokens)
    shutil.rmtree(build)
