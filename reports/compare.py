"""Regressions between two summary.json files of the same model (e.g. tonight vs last night)."""

from __future__ import annotations

from typing import Any

GROWTH = 2.0        # an error that more than doubles ...
FLOOR = 1e-6        # ... and exceeds this absolute level is a regression


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
        if "max_abs" in o and "max_abs" in n and n["max_abs"] > max(GROWTH * o["max_abs"], FLOOR):
            out.append(f"{label}: max_abs {o['max_abs']:.3g} -> {n['max_abs']:.3g}")
        if "tokens_matched" in o and "tokens_matched" in n and n["tokens_matched"] < o["tokens_matched"]:
            out.append(f"{label}: tokens matched {o['tokens_matched']} -> {n['tokens_matched']}")
    return out
