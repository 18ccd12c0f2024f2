"""Error statistics between a reference tensor and a candidate.

All statistics are computed in float64 on flattened data. ``worst_row_cosine`` treats the last
axis as the feature axis: one bad token hides in a global cosine over thousands of good ones.
"""

from __future__ import annotations

from dataclasses import dataclass, asdict
from typing import Any

import numpy as np

from ncnnport.contract import Tolerance


@dataclass(frozen=True)
class TensorStats:
    cosine: float
    worst_row_cosine: float
    max_abs: float
    mean_abs: float
    p99_abs: float
    ref_absmax: float
    nan: int
    inf: int
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    both_zero = (na == 0) & (nb == 0)
    denom = np.where(na * nb == 0, 1.0, na * nb)
    cos = np.where(na * nb == 0, 0.0, dots / denom)
    return np.where(both_zero, 1.0, cos)


def compare(reference: np.ndarray, candidate: np.ndarray, *, what: str = "tensor",
            feature_axis: int = -1) -> TensorStats:
    """Statistics of ``candidate - reference``; shapes must match exactly. ``feature_axis`` is
    the axis whose vectors ``worst_row_cosine`` compares (the last by default: tokens x hidden;
    channels for ``(B, C, T, H, W)`` video, where a "row" along W can be 2 pixels of noise)."""
    ref = np.asarray(reference)
    cand = np.asarray(candidate)
    if ref.shape != cand.shape:
        raise ValueError(f"{what}: shape {cand.shape} differs from reference {ref.shape}")
    r = ref.astype(np.float64).reshape(-1)
    c = cand.astype(np.float64).reshape(-1)
    nan = int(np.isnan(c).sum())
    inf = int(np.isinf(c).sum())
    finite = np.isfinite(c) & np.isfinite(r)
    if r.size == 0:
        return TensorStats(1.0, 1.0, 0.0, 0.0, 0.0, 0.0, nan, inf, tuple(ref.shape))
    if not finite.all():
        return TensorStats(float("nan"), float("nan"), float("inf"), float("inf"), float("inf"),
                           float(np.abs(r[np.isfinite(r)]).max(initial=0.0)), nan, inf, tuple(ref.shape))
    diff = np.abs(c - r)
    if not diff.any():  # bit-identical: report exact 1.0 rather than 0.9999999999999999
        return TensorStats(1.0, 1.0, 0.0, 0.0, 0.0, float(np.abs(r).max()), 0, 0, tuple(ref.shape))
    if ref.ndim >= 1 and feature_axis not in (-1, ref.ndim - 1):  # that axis last, then rows
        r = np.moveaxis(ref.astype(np.float64), feature_axis, -1).reshape(-1)
        c = np.moveaxis(cand.astype(np.float64), feature_axis, -1).reshape(-1)
    feat = ref.shape[feature_axis] if ref.ndim >= 1 and ref.shape[feature_axis] > 0 else 1
    rows = _row_cosines(r.reshape(-1, feat), c.reshape(-1, feat))
    return TensorStats(
        cosine=_cosine(r, c),
        worst_row_cosine=float(rows.min()),
        max_abs=float(diff.max()),
        mean_abs=float(diff.mean()),
        p99_abs=float(np.percentile(diff, 99)),
        ref_absmax=float(np.abs(r).max()),
        nan=nan,
        inf=inf,
        shape=tuple(ref.shape),
    )


def judge(stats: TensorStats, tol: Tolerance) -> tuple[bool, str]:
    """(passed, reason). NaN/Inf always fail; then cosine floor (global and worst row) and max_abs."""
    if stats.nan or stats.inf:
        return False, f"{stats.nan} NaN / {stats.inf} Inf"
    allowed = tol.max_abs_allowed(stats.ref_absmax)
    problems = []
    if stats.cosine < tol.min_cosine:
        problems.append(f"cosine {stats.cosine:.9f} < {tol.min_cosine}")
    if stats.worst_row_cosine < tol.min_cosine:
        problems.append(f"worst-row cosine {stats.worst_row_cosine:.9f} < {tol.min_cosine}")
    if stats.max_abs > allowed:
        problems.append(f"max_abs {stats.max_abs:.3g} > {allowed:.3g}")
    return (not problems), "; ".join(problems)
