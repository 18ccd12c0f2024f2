"""Vulkan modes have their own budgets, derived by the roundoff rule (not the CPU fp32 gate)."""

from pathlib import Path

import pytest
import torch

from ncnnport.parity.budgets import GELU_TANH_ERROR, effective_roundoff
from ncnnport.metrics import TensorStats, judge
from ncnnport.parity.policy import Policy
from ncnnport.parity.sweep import sweep, sweep_table, variants

ROOT = Path(__file__).resolve().parents[2]


def test_gelu_term_is_the_tanh_forms_error_against_erf():
    """ncnn's Vulkan GELU shader is the tanh form: the constant must be that formula's error."""
    x = torch.linspace(-12, 12, 2_400_001, dtype=torch.float64)
    err = (torch.nn.functional.gelu(x, approximate="tanh") - torch.nn.functional.gelu(x)).abs()
    assert (err / x.abs().clamp(min=1)).max().item() == pytest.approx(GELU_TANH_ERROR, rel=0.01)


def test_vulkan_fp32_adds_reduction_growth_and_the_gelu_term():
    assert effective_roundoff("vulkan_fp32", 64) == pytest.approx(2.0 ** -24 * 8 + GELU_TANH_ERROR)
    assert effective_roundoff("vulkan_fp16", 64) == pytest.approx(effective_roundoff("fp16_arithmetic", 64)
                                                                    + GELU_TANH_ERROR)


def test_sweep_judges_vulkan_rows_by_vulkan_modes():
    modes = {v.name: v.precision for v in variants(gpu=True)}
    assert modes["vulkan fp32"] == "vulkan_fp32" and modes["vulkan fp16-arithmetic"] == "vulkan_fp16"


def _stats(rel: float, cos: float) -> TensorStats:
    return TensorStats(cosine=cos, worst_row_cosine=cos, max_abs=rel, mean_abs=rel / 10, p99_abs=rel / 2,
                       ref_absmax=1.0, nan=0, inf=0, shape=(4, 8))


# Local rows measured on lavapipe (llvmpipe, LLVM 15.0.6) that the CPU budgets rejected:
# (model, module, mode, max_abs/max|ref|, worst-row cosine)
LAVAPIPE_ROWS = [
    ("qwen3_asr", "audio_conv", "vulkan_fp32", 3.63e-4, 0.99999995),     # 0.00107 > 0.000296 under fp32
    ("youtu_vl", "merger", "vulkan_fp32", 1.70e-4, 0.99999997),          # 0.00166 > 0.000974 under fp32
    ("youtu_vl", "vision_seg0", "vulkan_fp16", 7.76e-3, 0.999978),       # failed the fp16 cosine gate
]


@pytest.mark.parametrize("model,module,mode,rel,cos", LAVAPIPE_ROWS)
def test_lavapipe_rows_pass_their_vulkan_budget_and_failed_the_cpu_one(model, module, mode, rel, cos):
    policy = Policy.load(ROOT / "models" / model / "policy.json")
    assert judge(_stats(rel, cos), policy.module(module, mode)["*"])[0]
    cpu_mode = "fp32" if mode == "vulkan_fp32" else "fp16"
    assert not judge(_stats(rel, cos), policy.module(module, cpu_mode)["*"])[0]


def test_a_nan_still_fails_a_vulkan_budget():
    policy = Policy.load(ROOT / "models" / "seedvr2" / "policy.json")
    bad = TensorStats(cosine=1.0, worst_row_cosine=1.0, max_abs=0.0, mean_abs=0.0, p99_abs=0.0,
                      ref_absmax=1.0, nan=3, inf=0, shape=(4, 8))
    assert not judge(bad, policy.module("vae_encode", "vulkan_fp16")["*"])[0]


def test_a_raising_vulkan_option_is_a_failing_row_naming_the_option():
    def run_variant(v):
        if v.options.use_vulkan:
            raise RuntimeError("module vae_encode: vkCreateComputePipelines failed")
        return {"modules": [{"name": "m", "output": "y", "max_abs": 0.0, "ref_absmax": 1.0, "cosine": 1.0,
                             "passed": True}], "e2e": [], "gates_passed": True}

    result = sweep(run_variant, gpu=True)
    row = next(r for r in result["variants"] if r["variant"] == "vulkan fp32")
    assert not row["gates_passed"] and "vulkan fp32" in row["first_failure"]
    assert "vae_encode" in row["first_failure"] and result["first_breaking_option"] == "vulkan fp32"
    assert "vulkan rows ran on:" in sweep_table(result)


def test_vulkan_modes_use_their_own_accumulation_length_and_cpu_modes_keep_theirs():
    policy = Policy.load(ROOT / "models" / "youtu_vl" / "policy.json")
    rule = policy.rule
    assert rule.length_for("vulkan_fp16") == 64 and rule.length_for("fp16_arithmetic") == rule.accumulation_length
    assert policy.default("fp16_arithmetic") == policy.default("fp16")
