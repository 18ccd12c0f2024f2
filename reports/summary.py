"""Write summary.json and the Markdown acceptance report; print the gate table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from ncnnport.fsutil import atomic_write_text, write_json
from ncnnport.reports.rollup import module_rollup
from ncnnport.runtime.vulkan import vulkan_text


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "PASS" if v else "FAIL"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 1e-3 and abs(v) < 1e4:
            return f"{v:.6f}" if abs(v) < 1.001 else f"{v:.4g}"
        return f"{v:.3e}"
    return str(v)


METRICS = ("cosine", "worst_row_cosine", "max_abs")


def record_failure(r: dict[str, Any]) -> str | None:
    """Why a record fails, judged from its own fields (None if it passes): its ``passed`` flag,
    NaN/Inf counts, or a metric that is not a finite number."""
    if r.get("passed") is not True:
        return "marked failing"
    if r.get("nan") or r.get("inf"):
        return f"NaN {r.get('nan', 0)} / Inf {r.get('inf', 0)} in the output"
    for k in METRICS:
        v = r.get(k)
        if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v)):
            return f"{k} is {v!r}"
    return None


def recompute_gates(summary: dict[str, Any]) -> tuple[bool, list[str]]:
    """The verdict the records support: at least one record, every local and end-to-end record
    passing (flag, NaN/Inf, finite metrics), every option-sweep variant passing, stability
    passing. Returns (passed, one line per failing record or section)."""
    records = list(summary.get("modules", [])) + list(summary.get("e2e", []))
    why = []
    if not records:
        why.append("no parity records")
    for r in records:
        failure = record_failure(r)
        if failure:
            label = "/".join(str(x) for x in (r.get("name", r.get("fixture")), r.get("output", r.get("stage")),
                                              r.get("case")) if x is not None)
            why.append(f"{label}: {failure}")
    for v in (summary.get("option_sweep") or {}).get("variants", []):
        if v.get("gates_passed") is not True or v.get("failed_gates"):
            why.append(f"option sweep {v.get('variant')}: {v.get('failed_gates')} failed gate(s)")
    stab = summary.get("stability")
    if isinstance(stab, dict) and stab.get("passed") is not True:
        why.append(f"stability: {stab.get('reason') or 'failed'}")
    return not why, why


def verified_gates(summary: dict[str, Any]) -> list[str]:
    """Set ``gates_passed`` to what the records support (never raised above the stored value:
    a verdict may fail for reasons outside the records, e.g. a nightly regression). Returns a
    line per disagreement between the stored verdict and the records."""
    ok, why = recompute_gates(summary)
    stored = summary.get("gates_passed") is True
    summary["gates_passed"] = stored and ok
    if stored and not ok:
        return [f"summary says gates_passed=true but the records fail: {w}" for w in why]
    return []


def _table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def gate_table(summary: dict[str, Any]) -> str:
    rows = [[m["name"], "local", m["cases"], m["cosine"], m["worst_row_cosine"], m["max_abs"], m["rel"], "-",
             m["passed"]] for m in module_rollup(summary)]
    for r in summary["e2e"]:
        if r.get("kind") == "tokens":
            tokens = f"{r['tokens_matched']}/{r['tokens_compared']}"
            rows.append([r["fixture"], r["stage"], "-", None, None, None, None, tokens, r["passed"]])
        elif r.get("kind") == "trace":
            fd = r["first_divergence"]
            where = "none" if fd is None else f"{fd['module']}#{fd['call']}"
            rows.append([r["fixture"], r["stage"], r["calls_compared"], None, None, None, None,
                         f"first divergence: {where}", r["passed"]])
        elif "max_abs" not in r:
            rows.append([r["fixture"], r["stage"], "-", None, None, None, None, r.get("reason") or "equal",
                         r["passed"]])
        else:
            rel = r["max_abs"] / max(r.get("ref_absmax", 0.0), 1e-30)
            rows.append([r["fixture"], r["stage"], "-", r["cosine"], r["worst_row_cosine"], r["max_abs"], rel, "-",
                         r["passed"]])
    return _table(["module / fixture", "stage", "cases", "cosine", "worst row cos", "max_abs",
                   "max_abs/max|ref|", "tokens", "gate"], rows)


def device_line(summary: dict[str, Any]) -> str:
    """Where the ncnn side ran: the CPU, or the Vulkan device by name, type and driver (a
    software device such as lavapipe is labelled so, never as a GPU)."""
    machine = summary.get("machine") or {}
    cpu = f"CPU {machine.get('cpu_model', 'unknown')}"
    if not (summary.get("runtime_options") or {}).get("use_vulkan"):
        return cpu
    return f"{cpu}{vulkan_text(machine.get('vulkan_device'))}".replace("; Vulkan: ", ", Vulkan: ")


def markdown(summary: dict[str, Any]) -> str:
    verdict = "PASSED" if summary["gates_passed"] else "FAILED"
    failures = [r for r in summary["modules"] + summary["e2e"] if not r["passed"]]
    pol = summary["policy"]
    parts = [
        f"# ncnnport parity report: {summary['model']} ({summary['preset'] or summary['ckpt']})",
        "",
        f"**Verdict: {verdict}** - precision {summary['precision']}, ncnn options "
        f"`{summary['runtime_options']}`",
        "",
        f"Device: {device_line(summary)}",
        "",
        f"Policy: `{pol['file']}` version {pol['version']} sha256 `{pol['sha256']}`. "
        f"Package manifest sha256 `{summary['manifest_sha256']}`.",
        "",
        "## Gates",
        "",
        gate_table(summary),
        "",
    ]
    if failures:
        parts += ["## Failures", ""]
        parts += [f"- `{r.get('name', r.get('fixture'))}` {r.get('case', r.get('stage'))} "
                  f"{r.get('output', '')}: {r['reason']}" for r in failures]
        parts.append("")
    toks = [r for r in summary["e2e"] if r.get("kind") == "tokens"]
    if toks:
        parts += ["## Token sequences", ""]
        parts.append(_table(["fixture", "stage", "matched", "compared", "first mismatch", "top-2 margin there"],
                            [[r["fixture"], r["stage"], r["tokens_matched"], r["tokens_compared"],
                              r["first_mismatch"], r["margin_at_mismatch"]] for r in toks]))
        parts.append("")
    parts += ["## Local parity, every case", ""]
    parts.append(_table(["module", "output", "case", "cosine", "worst row cos", "max_abs", "mean_abs", "p99_abs",
                         "max|ref|", "NaN", "Inf", "gate"],
                        [[r["name"], r["output"], r["case"], r["cosine"], r["worst_row_cosine"], r["max_abs"],
                          r["mean_abs"], r["p99_abs"], r["ref_absmax"], r["nan"], r["inf"], r["passed"]]
                         for r in summary["modules"]]))
    mem = summary.get("memory") or {}
    stages = {k: v for k, v in mem.items() if isinstance(v, dict)}
    if stages:
        parts += ["", "## Export / convert memory (measured)", ""]
        parts.append(_table(["stage", "peak RSS (MB)", "at module", "largest module (MB)", "peak / largest",
                             "baseline RSS (MB)", "(peak - baseline) / largest"],
                            [[k, v.get("peak_rss_mb"), v.get("peak_module"), v.get("largest_module_mb"),
                              v.get("peak_over_largest"), v.get("baseline_rss_mb"),
                              v.get("peak_above_baseline_over_largest")] for k, v in stages.items()]))
    parts += ["", "## Versions", "", _table(["package", "version"], [[k, v] for k, v in summary["versions"].items()]),
              "", f"Timings (s): `{summary.get('timings_s', {})}`", ""]
    return "\n".join(parts)


def write_report(summary: dict[str, Any], report_dir: Path) -> Path:
    """summary.json, report.md, report.html (self-contained, with plots) and junit.xml."""
    from ncnnport.reports import html, junit

    verified_gates(summary)  # a report never shows PASSED over failing records
    report_dir.mkdir(parents=True, exist_ok=True)
    write_json(report_dir / "summary.json", summary)
    atomic_write_text(report_dir / "report.md", markdown(summary))
    atomic_write_text(report_dir / "report.html", html.render(summary))
    atomic_write_text(report_dir / "junit.xml", junit.render(summary))
    return report_dir / "summary.json"
