"""Token-level agreement beyond exact match: teacher-forced KL and top-k agreement, and a verdict
for each flip based on the logit noise measured in the same run.

A greedy flip at a step whose top-2 margin is smaller than the two pipelines' logit noise is a
near-tie (either answer is numerically defensible); a flip with a margin well above the noise is
a hard failure. The noise is measured, not assumed: the max |logit difference| over the
teacher-forced steps, where both pipelines saw the same tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

NEAR_TIE_FACTOR = 2.0  # each side may move by up to the noise, so margins below 2x can flip


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def teacher_forced_stats(reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray],
                         k: int = 5) -> dict[str, Any]:
    """KL(ref || cand) per step (mean, max), top-1 and top-k agreement, and the logit noise."""
    n = min(len(reference), len(candidate))
    if n == 0:
        return {"steps": 0}
    ref = np.stack([np.asarray(r, np.float64).reshape(-1) for r in reference[:n]])
    cand = np.stack([np.asarray(c, np.float64).reshape(-1) for c in candidate[:n]])
    lp, lq = _log_softmax(ref), _log_softmax(cand)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    top1 = (ref.argmax(-1) == cand.argmax(-1)).mean()
    kk = min(k, ref.shape[1])
    ref_top = np.argsort(-ref, axis=-1)[:, :kk]
    cand_top = np.argsort(-cand, axis=-1)[:, :kk]
    overlap = np.mean([len(set(a) & set(b)) / kk for a, b in zip(ref_top, cand_top)])
    return {"steps": int(n), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "top1_agreement": float(top1), f"top{kk}_overlap": float(overlap),
            "logit_noise": float(np.abs(ref - cand).max())}


def flip_verdict(margin: float | None, noise: float | None) -> str | None:
    if margin is None or noise is None:
        return None
    return "near-tie" if margin <= NEAR_TIE_FACTOR * noise else "hard failure"
