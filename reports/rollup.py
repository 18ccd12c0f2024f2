"""Per-module worst numbers of a summary, shared by the Markdown gate table and the HTML report
(its own module so the HTML renderer does not import the writer that calls it)."""

from __future__ import annotations

from typing import Any


def module_rollup(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Worst numbers per module over its cases and outputs."""
    by: dict[str, dict[str, Any]] = {}
    for r in summary["modules"]:
        m = by.setdefault(r["name"], {"name": r["name"], "cases": set(), "cosine": 1.0,
                                      "worst_row_cosine": 1.0, "max_abs": 0.0, "rel": 0.0, "passed": True})
        m["cases"].add(r["case"])
        m["cosine"] = min(m["cosine"], r["cosine"])
        m["worst_row_cosine"] = min(m["worst_row_cosine"], r["worst_row_cosine"])
        m["max_abs"] = max(m["max_abs"], r["max_abs"])
        m["rel"] = max(m["rel"], r["max_abs"] / max(r["ref_absmax"], 1e-30))
        m["passed"] = m["passed"] and r["passed"]
    for m in by.values():
        m["cases"] = len(m["cases"])
    return list(by.values())
