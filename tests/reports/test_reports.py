"""Reports render what was measured and regressions are flagged."""

import copy
from xml.etree import ElementTree as ET

from ncnnport.reports import compare, html, junit
from ncnnport.reports.summary import gate_table, markdown


def summary():
    row = {"name": "decode_layer0", "output": "h_out", "case": "past=5", "cosine": 1.0, "worst_row_cosine": 1.0,
           "max_abs": 1e-6, "mean_abs": 1e-7, "p99_abs": 5e-7, "ref_absmax": 2.0, "nan": 0, "inf": 0,
           "passed": True, "reason": ""}
    tok = {"fixture": "clip", "stage": "tokens", "kind": "tokens", "tokens_compared": 64, "tokens_matched": 64,
           "first_mismatch": None, "margin_at_mismatch": None, "reference_margins": [0.5, 0.01, 2.0],
           "logit_noise": 1e-4, "verdict": None, "passed": True, "reason": ""}
    return {"schema": 1, "model": "toy", "preset": "tiny", "ckpt": None, "precision": "fp32",
            "runtime_options": {}, "gates_passed": True, "policy": {"file": "policy.json", "version": 1,
                                                                  "sha256": "x"},
            "modules": [row], "e2e": [tok], "versions": {"ncnn": "1"}, "manifest_sha256": "m",
            "memory": {"export": {"peak_rss_mb": 10.0, "peak_module": "a", "largest_module_mb": 8.0,
                                  "peak_over_largest": 1.25}}}


def test_markdown_html_junit_show_the_measured_rows():
    s = summary()
    assert "decode_layer0" in gate_table(s) and "64/64" in gate_table(s)
    md = markdown(s)
    assert "Export / convert memory" in md and "1.25" in md
    page = html.render(s)
    assert page.count("<svg") >= 3 and "decode_layer0" in page and "<script" not in page
    s["modules"][0]["passed"] = False
    s["modules"][0]["reason"] = "max_abs 1 > 1e-4"
    suite = ET.fromstring(junit.render(s))
    assert suite.get("failures") == "1" and suite.find(".//failure").get("message") == "max_abs 1 > 1e-4"


def test_compare_flags_failures_growth_lost_tokens_and_missing_rows():
    old = summary()
    new = copy.deepcopy(old)
    assert compare.regressions(old, new) == []
    new["modules"][0]["max_abs"] = 5e-6           # grew 5x and above the floor
    new["e2e"][0]["tokens_matched"] = 60
    new["e2e"][0]["passed"] = False
    found = "\n".join(compare.regressions(old, new))
    assert "max_abs 1e-06 -> 5e-06" in found and "tokens matched 64 -> 60" in found and "fails now" in found
    gone = copy.deepcopy(old)
    gone["modules"] = []
    assert "missing in the new run" in compare.regressions(old, gone)[0]
