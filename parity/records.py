"""Builders for the records summary.json holds, shared by every model's e2e check.

A model's ``e2e_parity`` hook compares its pipeline stage by stage and returns these dicts;
the report stage only aggregates them. Keeping the builders here keeps the schema in one place.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.metrics import compare, judge
from ncnnport.runtime.sampling import top2_margin


def noise_relative_tolerance(base: Tolerance, noise: float, factor: float) -> Tolerance:
    """``base`` with its absolute floor raised to ``factor`` x the reference's own noise.

    Why: a fixed relative gate calibrated on shallow graphs is tighter than PyTorch's own fp32
    error once a deep stack accumulates rounding (Qwen3-ASR at 28 layers: transformers' fp32
    logits sit 2.5e-4 relative from the same model in float64, above a 1e-4 gate). The noise is
    measured in the same run (reference in float32 vs the same recipe in float64), so the gate
    follows the input instead of being loosened for every input; a real port error stays
    orders of magnitude above it. The base gate still applies where it is looser.
    """
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"reference noise must be a finite non-negative number, got {noise}")
    return dataclasses.replace(base, max_abs_floor=max(base.max_abs_floor, factor * float(noise)))


def stage_record(fixture: str, stage: str, reference: np.ndarray, candidate: np.ndarray,
                 tol: Tolerance, **extra: Any) -> dict[str, Any]:
    """One propagated tensor comparison (e.g. log-mel, encoder output, last logits)."""
    stats = compare(reference, candidate, what=f"{fixture}/{stage}")
    passed, reason = judge(stats, tol)
    rec: dict[str, Any] = {"fixture": fixture, "stage": stage, "kind": "tensor", **stats.to_json(),
                           "tolerance": tol.to_json(), "passed": passed, "reason": reason}
    rec.update(extra)
    return rec


def token_record(fixture: str, reference: Sequence[int], candidate: Sequence[int],
                 reference_logits: Sequence[np.ndarray] | None = None, *,
                 stage: str = "tokens", min_tokens: int = 1, logit_noise: float | None = None,
                 gate: dict[str, Any] | None = None, teacher_forced: dict[str, Any] | None = None,
                 **extra: Any) -> dict[str, Any]:
    """Greedy token sequences compared position by position.

    ``reference_logits[i]`` are the reference's logits at generated step i; at the first
    mismatch their top-2 margin says whether it was a near-tie, judged against the run's
    measured ``logit_noise`` (see parity.tokens). Passing requires identical sequences of at
    least ``min_tokens`` tokens: a near-tie is reported as such but still fails the gate.

    ``gate={"mode": "teacher_forced", "min_top1": x, "max_kl_mean": y}`` (reduced-precision
    modes) judges by the teacher-forced statistics instead: after one flip a free-running
    sequence diverges by construction, so exact match says little about a fp16/bf16 port.
    """
    ref = [int(t) for t in reference]
    cand = [int(t) for t in candidate]
    n = min(len(ref), len(cand))
    first = next((i for i in range(n) if ref[i] != cand[i]), None)
    if first is None and len(ref) != len(cand):
        first = n
    matched = n if first is None else first
    margin = None
    if first is not None and reference_logits is not None and first < len(reference_logits):
        margin = top2_margin(reference_logits[first])
    from ncnnport.parity.tokens import flip_verdict

    verdict = flip_verdict(margin, logit_noise)
    passed = first is None and len(ref) >= min_tokens
    gate = gate or {"mode": "exact"}
    if gate["mode"] == "teacher_forced":
        if not teacher_forced or not teacher_forced.get("steps"):
            raise ValueError(f"{fixture}: a teacher-forced token gate needs teacher-forced statistics")
        passed = (len(ref) >= min_tokens and teacher_forced["top1_agreement"] >= gate["min_top1"]
                  and teacher_forced["kl_mean"] <= gate["max_kl_mean"])
    reason = ""
    if first is not None:
        reason = f"first mismatch at step {first}"
        if margin is not None:
            reason += f" (reference top-2 margin {margin:.4g}"
            reason += f", logit noise {logit_noise:.3g}: {verdict})" if verdict else ")"
    elif len(ref) < min_tokens:
        reason = f"only {len(ref)} tokens compared, gate needs {min_tokens}"
    if gate["mode"] == "teacher_forced":
        reason = (f"teacher-forced top-1 {teacher_forced['top1_agreement']:.3f} (>= {gate['min_top1']}), "
                  f"KL mean {teacher_forced['kl_mean']:.3g} (<= {gate['max_kl_mean']}); " + reason)
    margins = [round(top2_margin(l), 6) for l in reference_logits] if reference_logits is not None else None
    rec: dict[str, Any] = {"fixture": fixture, "stage": stage, "kind": "tokens",
                           "reference_margins": margins,
                           "tokens_compared": len(ref), "tokens_matched": matched,
                           "first_mismatch": first, "margin_at_mismatch": margin,
                           "logit_noise": logit_noise, "verdict": verdict, "gate": gate,
                           "teacher_forced": teacher_forced,
                           "reference_tokens": ref, "candidate_tokens": cand,
                           "passed": passed, "reason": reason}
    rec.update(extra)
    return rec
