"""Regressions between two summary.json files of the same model (e.g. tonight vs last night)."""

from __future__ import annotations

import math
from typing import Any

GROWTH = 2.0        # an error that more than doubles ...
FLOOR = 1e-6        # ... and exceeds this absolute level is a regression
COSINE_FLOOR = 1e-7  # the same for a cosine's distance from 1 (the fp32 gate is 1e-6)


def _key_module(r: dict[str, Any]) -> tuple:
    return ("local", r["name"], r.get("output"), r["case"])


def _key_e2e(r: dict[str, Any]) -> tuple:
    return ("e2e", r["fixture"], r["stage"])


def regressions(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable regressions: gates that started failing, errors that grew, lost tokens,
    and records that disappeared (a gate nobody runs any more cannot fail)."""
    out = []
    if old.get("model") != new.get("model"):
        return [f"different models: {old.get('model')} vs {new.get('model')}"]
    before = {_key_module(r): r for r in old["modules"]} | {_key_e2e(r): r for r in old["e2e"]}
    after = {_key_module(r): r for r in new["modules"]} | {_key_e2e(r): r for r in new["e2e"]}
    for key, o in before.items():
        n = after.get(key)
        label = "/".join(str(k) for k in key if k is not None)
        if n is None:
            out.append(f"{label}: missing in the new run")
            continue
        if o["passed"] and not n["passed"]:
            out.append(f"{label}: passed before, fails now ({n.get('reason', '')})")
        out += [f"{label}: {line}" for line in metric_regressions(o, n)]
        if "tokens_matched" in o and "tokens_matched" in n and n["tokens_matched"] < o["tokens_matched"]:
            out.append(f"{label}: tokens matched {o['tokens_matched']} -> {n['tokens_matched']}")
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def nonfinite_regressions(o: dict[str, Any], n: dict[str, Any]) -> list[str]:
    """NaN/Inf that appeared: counts that grew, or a metric that became NaN or infinite."""
    out = []
    for k, label in (("nan", "NaN"), ("inf", "Inf")):
        if (n.get(k) or 0) > (o.get(k) or 0):
            out.append(f"{label} count {o.get(k) or 0} -> {n.get(k)}")
    for k in ("cosine", "worst_row_cosine", "max_abs"):
        if k in n and n[k] is not None and not _finite(n[k]) and (o.get(k) is None or _finite(o[k])):
            out.append(f"{k} {o.get(k)!r} -> {n[k]!r}")
    return out


def metric_regressions(o: dict[str, Any], n: dict[str, Any]) -> list[str]:
    """Finite metrics that got worse: max_abs more than doubled above FLOOR; cosine or worst-row
    cosine whose distance from 1 more than doubled above COSINE_FLOOR; plus NaN/Inf."""
    out = nonfinite_regressions(o, n)
    if _finite(o.get("max_abs")) and _finite(n.get("max_abs")) and n["max_abs"] > max(GROWTH * o["max_abs"], FLOOR):
        out.append(f"max_abs {o['max_abs']:.3g} -> {n['max_abs']:.3g}")
    for k in ("cosine", "worst_row_cosine"):
        if _finite(o.get(k)) and _finite(n.get(k)) and 1 - n[k] > max(GROWTH * (1 - o[k]), COSINE_FLOOR):
            out.append(f"{k} {o[k]:.9f} -> {n[k]:.9f}")
    return out
