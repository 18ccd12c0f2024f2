"""Self-contained HTML report: tables plus inline SVG plots, no external assets or scripts.

The page is a jinja2 template (``templates/report.html.jinja``) with autoescaping on: every
name that comes from a model, a fixture file or a user's checkpoint is text, never markup. The
only markup passed in unescaped is the SVG that matplotlib wrote (its own text is escaped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from ncnnport.reports.rollup import module_rollup

TEMPLATE = "report.html.jinja"


@dataclass
class Cell:
    text: str
    css: str = ""


@dataclass
class Table:
    headers: list[str]
    rows: list[list[Cell]] = field(default_factory=list)


@dataclass
class Chart:
    title: str
    svg: Any  # markupsafe.Markup of matplotlib's SVG


def cell(v: Any) -> Cell:
    """A table cell as the report shows it: gates as PASS/FAIL, floats with 6 significant digits."""
    if isinstance(v, bool):
        return Cell("PASS" if v else "FAIL", "ok" if v else "bad")
    if isinstance(v, float):
        return Cell(f"{v:.6g}")
    return Cell("-" if v is None else str(v))


def table(headers: list[str], rows: Sequence[Sequence[Any]]) -> Table:
    return Table(headers, [[cell(c) for c in r] for r in rows])


def chart(title: str, labels: Sequence[object], series: dict[str, Sequence[float | None]], **kw: Any) -> Chart:
    """A matplotlib line chart, marked safe for the template (drawn by us, text escaped by matplotlib)."""
    from markupsafe import Markup

    from ncnnport.reports.svg import line_chart

    return Chart(title, Markup(line_chart(title, labels, series, **kw)))


@lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def _local_charts(summary: dict[str, Any]) -> list[Chart]:
    roll = module_rollup(summary)
    if not roll:
        return []
    names = [m["name"] for m in roll]
    return [
        chart("worst max_abs / max|ref| per module", names, {"max_abs / max|ref|": [m["rel"] for m in roll]},
              log=True, threshold=1e-4, y_label="relative max_abs"),
        chart("worst cosine per module (1 - cosine)", names,
              {"1 - cosine": [max(1 - m["cosine"], 1e-16) for m in roll],
               "1 - worst-row cosine": [max(1 - m["worst_row_cosine"], 1e-16) for m in roll]},
              log=True, threshold=1e-6, y_label="1 - cosine"),
    ]


def _traces(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for tr in [r for r in summary["e2e"] if r.get("kind") == "trace"]:
        mods, fd = tr["modules"], tr["first_divergence"]
        out.append({
            "fixture": tr["fixture"], "calls_compared": tr["calls_compared"],
            "first_divergence": f"{fd['module']} call {fd['call']}" if fd else "none",
            "chart": chart("max_abs per module in execution order", [m["module"] for m in mods],
                           {"propagated": [m["propagated_max_abs"] for m in mods],
                            "local": [m["local_max_abs"] for m in mods]}, log=True, y_label="max_abs"),
            "table": table(["module", "calls", "propagated max_abs", "local max_abs", "propagated / local"],
                           [[m["module"], m["calls"], m["propagated_max_abs"], m["local_max_abs"], m["ratio"]]
                            for m in mods]),
        })
    return out


def _margins(summary: dict[str, Any], limit: int = 8) -> list[dict[str, Any]]:
    toks = [r for r in summary["e2e"] if r.get("kind") == "tokens" and r.get("reference_margins")]
    return [{"fixture": r["fixture"], "stage": r["stage"], "matched": r["tokens_matched"],
             "compared": r["tokens_compared"],
             "chart": chart(f"{r['fixture']} {r['stage']}", list(range(len(r["reference_margins"]))),
                            {"top-2 margin": r["reference_margins"]}, log=True,
                            threshold=(2 * r["logit_noise"]) if r.get("logit_noise") else None,
                            y_label="margin")}
            for r in toks[:limit]]


def _e2e_row(r: dict[str, Any]) -> list[Any]:
    if r.get("kind") == "tokens":
        return [r["fixture"], r["stage"], f"{r['tokens_matched']}/{r['tokens_compared']}",
                r.get("first_mismatch"), r.get("margin_at_mismatch"), r.get("verdict"), r["passed"]]
    if "max_abs" in r:
        return [r["fixture"], r["stage"], f"cos {r['cosine']:.9f}", f"max_abs {r['max_abs']:.3g}",
                f"max|ref| {r['ref_absmax']:.3g}", r.get("reason") or "", r["passed"]]
    return [r["fixture"], r["stage"], "", "", "", r.get("reason") or "", r["passed"]]


def render(summary: dict[str, Any]) -> str:
    """The report page for one parity summary."""
    ctx = {
        "title": f"ncnnport parity: {summary['model']} ({summary.get('preset') or summary.get('ckpt')})",
        "passed": bool(summary["gates_passed"]), "precision": str(summary["precision"]),
        "policy": str(summary["policy"]),
        "local_charts": _local_charts(summary), "traces": _traces(summary), "margins": _margins(summary),
        "e2e": table(["fixture", "stage", "value", "detail", "detail", "verdict", "gate"],
                     [_e2e_row(r) for r in summary["e2e"]]),
        "local": table(["module", "output", "case", "cosine", "worst row cos", "max_abs", "p99_abs", "gate"],
                       [[r["name"], r["output"], r["case"], r["cosine"], r["worst_row_cosine"], r["max_abs"],
                         r["p99_abs"], r["passed"]] for r in summary["modules"]]),
        "versions": table(["package", "version"], [[k, v] for k, v in summary["versions"].items()]),
    }
    return _environment().get_template(TEMPLATE).render(**ctx)
