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


def test_a_hand_edited_verdict_over_failing_records_is_reported_failing(tmp_path):
    from ncnnport.reports.summary import recompute_gates, write_report

    s = summary()
    s["modules"][0]["passed"] = False
    s["modules"][0]["reason"] = "max_abs 1 > 1e-4"
    assert s["gates_passed"] is True                        # hand-edited
    assert recompute_gates(s)[0] is False
    write_report(s, tmp_path)
    assert s["gates_passed"] is False and "**Verdict: FAILED**" in (tmp_path / "report.md").read_text()
    nan = summary()
    nan["modules"][0]["nan"] = 3                             # "passed" over NaN outputs
    ok, why = recompute_gates(nan)
    assert not ok and "NaN 3" in why[0]
    assert recompute_gates({**summary(), "modules": [], "e2e": []})[0] is False


def test_report_cli_recomputes_the_verdict(tmp_path, capsys):
    import json

    from ncnnport.cli import main

    folder = tmp_path / "reports" / "qwen3-asr"
    folder.mkdir(parents=True)
    s = summary()
    s["model"] = "qwen3-asr"
    s["e2e"][0]["passed"] = False
    (folder / "summary.json").write_text(json.dumps(s))
    assert main(["report", "qwen3-asr", "--build-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "summary says gates_passed=true but the records fail: clip/tokens: marked failing" in captured.err
    assert "FAILED" in captured.out


def test_compare_flags_nan_inf_and_cosine_drops():
    old = summary()
    new = copy.deepcopy(old)
    new["modules"][0].update(nan=2, cosine=0.99999, worst_row_cosine=0.9999)
    found = "\n".join(compare.regressions(old, new))
    assert "NaN count 0 -> 2" in found
    assert "cosine 1.000000000 -> 0.999990000" in found
    assert "worst_row_cosine 1.000000000 -> 0.999900000" in found
    inf = copy.deepcopy(old)
    inf["modules"][0]["max_abs"] = float("inf")
    assert "max_abs 1e-06 -> inf" in "\n".join(compare.regressions(old, inf))
    tiny = copy.deepcopy(old)
    tiny["modules"][0]["cosine"] = 1 - 5e-8                   # below the floor: noise, not a regression
    assert compare.regressions(old, tiny) == []


def test_compare_reads_a_folder_as_its_summary(tmp_path, capsys):
    import json

    from ncnnport.cli import main

    for name, cos in (("old", 1.0), ("qwen3-asr", 0.999)):
        folder = tmp_path / "reports" / name
        folder.mkdir(parents=True)
        s = summary()
        s["model"] = "qwen3-asr"
        s["modules"][0]["cosine"] = cos
        (folder / "summary.json").write_text(json.dumps(s))
    assert main(["report", "qwen3-asr", "--build-dir", str(tmp_path),
                 "--compare", str(tmp_path / "reports" / "old")]) == 1
    assert "cosine 1.000000000 -> 0.999000000" in capsys.readouterr().out


def test_html_plots_are_matplotlib_svg_inline_and_reproducible():
    s = summary()
    page = html.render(s)
    charts = page.count("<svg")
    assert charts == 3 and page.count("Matplotlib") >= charts       # drawn by matplotlib, inline
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page      # no prolog inside HTML
    assert ">decode_layer0<" in page.split("<svg", 1)[1]            # labels are text in the SVG
    assert html.render(s) == page                                   # byte-reproducible report


def test_html_escapes_untrusted_names_in_tables_and_plots():
    s = summary()
    s["modules"][0]["name"] = "<script>alert(1)</script>"
    s["e2e"][0]["fixture"] = "clip\"><img src=x onerror=alert(1)>.wav"
    page = html.render(s)
    assert "<script" not in page and "<img" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 2  # the table and the plot's label


def test_report_template_is_package_data():
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    rel = "templates/" + html.TEMPLATE
    assert (root / "reports" / rel).is_file()
    assert any(fnmatch.fnmatch(rel, p) for p in patterns.get("ncnnport.reports", []))


def test_runtime_and_report_imports_load_neither_matplotlib_nor_scipy():
    import subprocess
    import sys

    code = ("import sys, ncnnport.cli, ncnnport.stages, ncnnport.runtime.session, ncnnport.runtime.bench, "
            "ncnnport.reports.html\nprint(sorted(m for m in ('matplotlib', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_vulkan_report_names_its_device_and_a_software_one_is_not_a_gpu():
    s = summary()
    s["machine"] = {"cpu_model": "AMD EPYC", "vulkan_device": {
        "index": 0, "name": "llvmpipe (LLVM 15.0.6, 256 bits)", "type": "software", "vendor": "Mesa",
        "driver_version": "1", "label": "software Vulkan (lavapipe)"}}
    assert "Device: CPU AMD EPYC\n" in markdown(s)
    s["runtime_options"] = {"use_vulkan": True}
    line = next(x for x in markdown(s).splitlines() if x.startswith("Device:"))
    assert "software Vulkan (lavapipe)" in line and "llvmpipe" in line and "Mesa driver 1" in line
