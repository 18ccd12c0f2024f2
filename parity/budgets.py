"""Reduced-precision budgets derived from the mode's unit roundoff, not fitted to one machine.

Why a rule: which ops round in a reduced-precision mode depends on the ISA path ncnn picks at
run time. On x86 without AVX-512 FP16, ``use_fp16_storage`` only stores some weights in fp16
(a graph can be bitwise fp32), while ARM (asimdhp) or AVX-512 FP16/BF16 paths cast the input of
every layer that supports the mode (ncnn ``net.cpp``: ``cast_float32_to_float16/bfloat16``
before ``forward``). A budget fitted to the path one machine happened to run fails on the next.

The rule assumes the worst path: every storage point rounds to the mode's unit roundoff ``u``
(bf16: 2^-8, fp16: 2^-11). First-order error analysis then makes the output error of a fixed
computation proportional to ``u``; the factor is the model's error amplification ``kappa``,
a property of the computation (depth, norms, softmax), not of the precision or the machine:

    max_abs_rel    = margin * kappa_abs * u
    1 - min_cosine = (margin * kappa_cos * u)^2 / 2      (cosine deficit of a relative rms error e is e^2/2)
    max_abs_floor  = fp32 floor scaled by the same factor as max_abs_rel

``kappa`` is measured once per model in the mode that rounds everywhere on every machine (bf16
storage: x86 casts every bf16-capable layer's input) as error / u, and stated with its numbers
in the policy notes. It is the LOCAL amplification: one graph fed the reference's exact inputs,
which is what the module gates (local parity, the golden vectors, the trace's local check)
judge. A pipeline run on its own outputs compounds every upstream graph's error (a 64-step
decode feeds each step's rounded K/V to the next), so a policy may state that larger
amplification apart (``roundoff_rule.propagated``, one graph's own in ``propagated.modules``):
it derives the stage gates and the trace's propagated check, never below the local kappa. One
kappa for both would have to be the propagated one, which leaves every local gate as loose as
the deepest pipeline's drift. fp16 arithmetic also accumulates in fp16: its ``u`` is multiplied
by sqrt(accumulation length) (random-walk growth of a K-term fp16 sum). A derived budget is
never tighter than the fp32 gate, whose own margin covers the measured fp32 noise.

Vulkan modes get their own budgets: ncnn's Vulkan fp32 is not bitwise its CPU fp32. Its shaders
sum in another order (and fuse multiply-adds), which is fp32 roundoff growing with the reduction
length like fp16 arithmetic's (u x sqrt(K), u = 2^-24), and its GELU shader always evaluates the
tanh form (ncnn ``gelu.comp``: ``0.5x(1 + tanh(0.79788452(x + 0.044715x^3)))``, whatever the
layer's ``fast_gelu``), an approximation of the erf GELU PyTorch computes. Its error is a fixed
property of the formula, ``GELU_TANH_ERROR`` below, added to the mode's roundoff: a graph's GELU
inputs are perturbed by that relative amount on every Vulkan device, software or GPU. Vulkan fp16
(``use_fp16_storage/packed/arithmetic``, ncnn's default on a GPU) stores and accumulates in fp16:
fp16 arithmetic's roundoff plus the same GELU term.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from ncnnport.contract import Tolerance

# int8 weights round on a grid of absmax / 127 per 128-block, so their rms error relative to the
# block's rms is crest / (254 sqrt 3) where bf16's is 2^-8 / sqrt 3: the ratio is crest x 256/254.
# crest: the expected absmax / rms of a 128-block of Gaussian values (2.83; recomputed by
# tests/ncnnport/test_int8_precision.py). Token metrics follow the rms error (KL ~ its square,
# top-1 misses ~ it), so int8's token gates are bf16's scaled by this ratio (policy notes).
INT8_BLOCK_CREST = 2.83
INT8_RMS_RATIO = INT8_BLOCK_CREST * 256 / 254
# The tensor budgets take the same ratio: the rule's kappa is the error amplification of bf16's
# rounding, measured by its output error, and a product's output error follows its inputs' rms
# error, not their worst element. So int8's roundoff for the rule is the relative rounding whose
# rms error equals int8's: r x 2^-8 = 1.11e-2, not half a step over the absmax (1/254 = 3.94e-3,
# which judged int8 as if it were bf16: a Youtu-VL vision tower with its Gemms in int8 read
# max_abs/max|ref| 0.032 against that 0.0315, at cosine 0.9998).
INT8_ROUNDOFF = INT8_RMS_RATIO * 2.0 ** -8

# unit roundoff (half an ulp of 1.0) of each precision mode's storage format
UNIT_ROUNDOFF: dict[str, float] = {
    "fp32": 2.0 ** -24,
    "fp16": 2.0 ** -11,
    "fp16_weights": 2.0 ** -11,
    "int8_weights": INT8_ROUNDOFF,  # package-int8w: the rms-equivalent rounding above
    "fp16_arithmetic": 2.0 ** -11,
    "bf16": 2.0 ** -8,
    "vulkan_fp32": 2.0 ** -24,
    "vulkan_fp16": 2.0 ** -11,
}

# sup_x |gelu_tanh(x) - gelu_erf(x)| / max(1, |x|): the tanh form's error relative to the size of
# its input (at x = 2.59; recomputed from both formulas by tests/parity/test_vulkan_budgets.py)
GELU_TANH_ERROR = 1.79e-4

# modes whose roundoff grows with the reduction length K (u x sqrt(K)) and the op-approximation
# error each adds on top of its roundoff
ACCUMULATING_MODES = ("fp16_arithmetic", "vulkan_fp32", "vulkan_fp16")
APPROXIMATION_ERROR: dict[str, float] = {"vulkan_fp32": GELU_TANH_ERROR, "vulkan_fp16": GELU_TANH_ERROR}


@dataclass(frozen=True)
class RoundoffRule:
    """A model's error amplification and the margin its budgets keep above it."""

    kappa_abs: float
    kappa_cos: float
    margin: float = 2.0
    accumulation_length: int = 1  # longest reduction the model runs (fp16 arithmetic only)
    # the same for ncnn's Vulkan shaders, which always accumulate in the storage type's arithmetic
    # (fp16 under vulkan_fp16) on every device; None: ``accumulation_length``
    vulkan_accumulation_length: int | None = None

    def length_for(self, precision: str) -> int:
        """The reduction length the rule grows ``precision``'s roundoff by."""
        if precision.startswith("vulkan_") and self.vulkan_accumulation_length is not None:
            return self.vulkan_accumulation_length
        return self.accumulation_length

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], where: str) -> "RoundoffRule":
        """Parse a policy's ``roundoff_rule`` block; ``where`` names the file in errors."""
        missing = [k for k in ("kappa_abs", "kappa_cos") if k not in raw]
        if missing:
            raise ValueError(f"{where}: roundoff_rule needs {', '.join(missing)}")
        rule = cls(kappa_abs=float(raw["kappa_abs"]), kappa_cos=float(raw["kappa_cos"]),
                   margin=float(raw.get("margin", 2.0)),
                   accumulation_length=int(raw.get("accumulation_length", 1)),
                   vulkan_accumulation_length=(None if raw.get("vulkan_accumulation_length") is None
                                               else int(raw["vulkan_accumulation_length"])))
        if rule.kappa_abs <= 0 or rule.kappa_cos <= 0 or rule.margin < 1 or rule.accumulation_length < 1 \
                or (rule.vulkan_accumulation_length is not None and rule.vulkan_accumulation_length < 1):
            raise ValueError(f"{where}: roundoff_rule needs kappa_abs, kappa_cos > 0, margin >= 1, "
                             f"accumulation_length (and vulkan_accumulation_length) >= 1")
        return rule

    def at_least(self, raw: Mapping[str, Any] | None) -> "RoundoffRule":
        """The same rule with each kappa raised to ``raw``'s where that is larger: the
        amplification of a comparison on the pipeline's own inputs (``roundoff_rule.propagated``)
        is at least that of the graph fed the reference's exact inputs."""
        if not raw:
            return self
        return dataclasses.replace(self, kappa_abs=max(self.kappa_abs, float(raw.get("kappa_abs", 0.0))),
                                   kappa_cos=max(self.kappa_cos, float(raw.get("kappa_cos", 0.0))))

    def override(self, raw: Mapping[str, Any] | None) -> "RoundoffRule":
        """The same rule with a module's or stage's own measured amplification."""
        if not raw:
            return self
        return RoundoffRule(kappa_abs=float(raw.get("kappa_abs", self.kappa_abs)),
                            kappa_cos=float(raw.get("kappa_cos", self.kappa_cos)),
                            margin=self.margin, accumulation_length=self.accumulation_length,
                            vulkan_accumulation_length=self.vulkan_accumulation_length)


def effective_roundoff(precision: str, accumulation_length: int = 1) -> float:
    """The relative error one step of ``precision`` adds: its unit roundoff (a K-term sum for the
    accumulating modes) plus the approximation error of the ops the mode swaps in (Vulkan GELU)."""
    if precision not in UNIT_ROUNDOFF:
        raise ValueError(f"precision mode {precision!r}: known modes are {', '.join(UNIT_ROUNDOFF)}")
    u = UNIT_ROUNDOFF[precision]
    if precision in ACCUMULATING_MODES:
        u *= math.sqrt(accumulation_length)
    return u + APPROXIMATION_ERROR.get(precision, 0.0)


# The largest relative error a derived budget allows. The rule is first order (an error small
# against the signal; its cosine budget is the small-angle form), which stops holding as the
# error approaches the signal, and a looser relative gate stops telling a wrong reference from a
# rounded one: at 1 no single wrong element can fail, since the reference's absmax includes it.
# Reached only by int8 in Qwen3-ASR's propagated gates (propagated kappa 56 from its chaotic
# 64-step trace: 2 x 56 x 1.11e-2 = 1.24), which stay at max_abs_rel 0.5, cosine >= 0.875; its
# local gates (kappa 20) are 0.44 / 0.90.
PERTURBATION_LIMIT = 0.5


def derive(rule: RoundoffRule, precision: str, fp32: Tolerance) -> Tolerance:
    """The budget of ``precision`` under ``rule``, never tighter than the fp32 gate ``fp32`` and
    never past :data:`PERTURBATION_LIMIT`."""
    u = effective_roundoff(precision, rule.length_for(precision))
    rel = min(rule.margin * rule.kappa_abs * u, PERTURBATION_LIMIT)
    deficit = 0.5 * min(rule.margin * rule.kappa_cos * u, PERTURBATION_LIMIT) ** 2
    max_abs_rel = max(rel, fp32.max_abs_rel)
    scale = max_abs_rel / fp32.max_abs_rel if fp32.max_abs_rel > 0 else 1.0
    return Tolerance(min_cosine=min(1.0 - deficit, fp32.min_cosine), max_abs_rel=max_abs_rel,
                     max_abs_floor=fp32.max_abs_floor * scale)


def amplification(max_abs_rel: float, worst_row_cosine: float, precision: str) -> tuple[float, float]:
    """(kappa_abs, kappa_cos) a measurement implies: the inverse of :func:`derive` without margin.

    Used to state a policy's kappa from a sweep row (and by tests to check that a measured row
    on another ISA path sits inside the budget)."""
    u = UNIT_ROUNDOFF[precision]
    return max_abs_rel / u, math.sqrt(max(0.0, 2.0 * (1.0 - worst_row_cosine))) / u
