"""Self-contained HTML report: tables plus inline SVG plots, no external assets or scripts."""

from __future__ import annotations

from html import escape
from typing import Any

from ncnnport.reports.rollup import module_rollup
from ncnnport.reports.svg import line_chart


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, bool):
            return f'<td class="{"ok" if v else "bad"}">{"PASS" if v else "FAIL"}</td>'
        if isinstance(v, float):
            return f"<td>{v:.6g}</td>"
        return f"<td>{escape(str(v)) if v is not None else '-'}</td>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(c) for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(summary: dict[str, Any]) -> str:
    ok = summary["gates_passed"]
    title = f"ncnnport parity: {summary['model']} ({summary.get('preset') or summary.get('ckpt')})"
    roll = module_rollup(summary)
    sections = [f"<h1>{escape(title)}</h1>",
                f'<p class="{"ok" if ok else "bad"}"><b>{"PASSED" if ok else "FAILED"}</b> - precision '
                f'{escape(str(summary["precision"]))}, policy {escape(str(summary["policy"]))}</p>']
    if roll:
        names = [m["name"] for m in roll]
        sections.append("<h2>Local parity along the pipeline</h2>")
        sections.append(line_chart("worst max_abs / max|ref| per module", names,
                                   {"max_abs / max|ref|": [m["rel"] for m in roll]}, log=True,
                                   threshold=1e-4, y_label="relative max_abs"))
        sections.append(line_chart("worst cosine per module (1 - cosine)", names,
                                   {"1 - cosine": [max(1 - m["cosine"], 1e-16) for m in roll],
                                    "1 - worst-row cosine": [max(1 - m["worst_row_cosine"], 1e-16) for m in roll]},
                                   log=True, threshold=1e-6, y_label="1 - cosine"))
    for tr in [r for r in summary["e2e"] if r.get("kind") == "trace"]:
        mods = tr["modules"]
        sections.append(f"<h2>Propagated vs local error, {escape(tr['fixture'])}</h2>")
        fd = tr["first_divergence"]
        sections.append(f"<p>First divergence: <b>{escape(fd['module'] + ' call ' + str(fd['call'])) if fd else 'none'}"
                        f"</b> over {tr['calls_compared']} compared outputs.</p>")
        sections.append(line_chart("max_abs per module in execution order", [m["module"] for m in mods],
                                   {"propagated": [m["propagated_max_abs"] for m in mods],
                                    "local": [m["local_max_abs"] for m in mods]}, log=True, y_label="max_abs"))
        sections.append(_table(["module", "calls", "propagated max_abs", "local max_abs", "propagated / local"],
                               [[m["module"], m["calls"], m["propagated_max_abs"], m["local_max_abs"], m["ratio"]]
                                for m in mods]))
    toks = [r for r in summary["e2e"] if r.get("kind") == "tokens" and r.get("reference_margins")]
    if toks:
        sections.append("<h2>Reference top-2 logit margins per generated step</h2>")
        for r in toks[:8]:
            sections.append(f"<h3>{escape(r['fixture'])}: {escape(r['stage'])} "
                            f"({r['tokens_matched']}/{r['tokens_compared']} tokens match; dashed line = 2 x logit noise)</h3>")
            sections.append(line_chart(f"{r['fixture']} {r['stage']}", list(range(len(r["reference_margins"]))),
                                       {"top-2 margin": r["reference_margins"]}, log=True,
                                       threshold=(2 * r["logit_noise"]) if r.get("logit_noise") else None,
                                       y_label="margin"))
    rows = []
    for r in summary["e2e"]:
        if r.get("kind") == "tokens":
            rows.append([r["fixture"], r["stage"], f"{r['tokens_matched']}/{r['tokens_compared']}",
                         r.get("first_mismatch"), r.get("margin_at_mismatch"), r.get("verdict"), r["passed"]])
        elif "max_abs" in r:
            rows.append([r["fixture"], r["stage"], f"cos {r['cosine']:.9f}", f"max_abs {r['max_abs']:.3g}",
                         f"max|ref| {r['ref_absmax']:.3g}", r.get("reason") or "", r["passed"]])
        else:
            rows.append([r["fixture"], r["stage"], "", "", "", r.get("reason") or "", r["passed"]])
    sections.append("<h2>End-to-end stages</h2>")
    sections.append(_table(["fixture", "stage", "value", "detail", "detail", "verdict", "gate"], rows))
    sections.append("<h2>Local parity, every case</h2>")
    sections.append(_table(["module", "output", "case", "cosine", "worst row cos", "max_abs", "p99_abs", "gate"],
                           [[r["name"], r["output"], r["case"], r["cosine"], r["worst_row_cosine"], r["max_abs"],
                             r["p99_abs"], r["passed"]] for r in summary["modules"]]))
    sections.append("<h2>Versions</h2>" + _table(["package", "version"],
                                                  [[k, v] for k, v in summary["versions"].items()]))
    style = ("body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse;"
             "font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px}.ok{color:#1a7f37}"
             ".bad{color:#cf222e}svg{display:block;margin:8px 0}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(sections)}</body></html>\n")
