"""JUnit XML: one testcase per gate, so CI systems show parity failures like test failures."""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET


def render(summary: dict[str, Any]) -> str:
    cases = []
    for r in summary["modules"]:
        cases.append((f"local.{r['name']}", f"{r['output']}[{r['case']}]", r["passed"], r.get("reason", "")))
    for r in summary["e2e"]:
        cases.append((f"e2e.{r['fixture']}", r["stage"], r["passed"], r.get("reason", "")))
    suite = ET.Element("testsuite", name=f"ncnnport.{summary['model']}.{summary['precision']}",
                       tests=str(len(cases)), failures=str(sum(not c[2] for c in cases)))
    for classname, name, passed, reason in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if not passed:
            ET.SubElement(case, "failure", message=reason or "gate failed").text = reason
    return ET.tostring(suite, encoding="unicode") + "\n"
