"""Local parity of every sweep variant replayed on another ISA path, without torch.

Why: a reduced-precision budget must hold on whichever ISA path ncnn picks (AVX2+F16C here,
AVX-512 FP16/BF16 or SSE-only elsewhere), and the way to show it on one machine is to run the
ncnn side under an emulated CPU (``qemu-x86_64 -cpu Nehalem``: no AVX, F16C or FMA), where
importing torch alone takes minutes. So the reference side is computed once, natively
(``dump``: each module's example inputs at every parity size and the torch outputs), and the
ncnn side runs anywhere on the dumped cases (``replay``: ncnn + numpy only), judged by the
policy's budget of each variant's precision mode.

    ncnnport isa-replay dump qwen3-asr CASES            # native, needs torch
    qemu-x86_64 -cpu Nehalem .venv/bin/ncnnport isa-replay replay \\
        build/qwen3-asr/tiny/package CASES models/qwen3_asr/policy.json

The dump side lives with the other drivers (``ncnnport/drivers/isa_replay.py``): it needs a
prepared model; this replay side needs only a package, the cases and a policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ncnnport.metrics import compare, judge
from ncnnport.parity.policy import Policy
from ncnnport.parity.sweep import variants

INDEX = "cases.json"


def replay(package: Path, cases: Path, policy: Policy) -> list[dict[str, Any]]:
    """One row per sweep variant: worst relative max_abs and cosine over all cases, and whether
    every output is within the variant's precision budget (pnnx fp16 or int8 weights: the sibling
    ``package-fp16w`` / ``package-int8w`` when it exists)."""
    from ncnnport.runtime import precision
    from ncnnport.runtime.lazy_modules import LazyModules

    index = json.loads((cases / INDEX).read_text())
    rows = []
    for v in variants(gpu=False):
        pkg = package.with_name(precision.get(v.setting).package_name)
        if not (pkg / "manifest.json").is_file():
            continue
        mods = LazyModules(pkg, options=v.options)
        worst_rel, min_cos, failures = 0.0, 1.0, []
        for case in index:
            tols = policy.module(case["module"], v.precision)
            with np.load(cases / case["file"]) as z:
                inputs = [z[f"in{k}"] for k in range(sum(1 for f in z.files if f.startswith("in")))]
                refs = [z[f"ref{k}"] for k in range(len(case["outputs"]))]
            got = mods[case["module"]].run(inputs)
            for out, r, g in zip(case["outputs"], refs, got):
                st = compare(r, g, what=f"{case['module']}/{out['name']}", feature_axis=out["feature_axis"])
                ok, reason = judge(st, tols.get(out["name"], tols["*"]))
                worst_rel = max(worst_rel, st.max_abs / max(st.ref_absmax, 1e-30))
                min_cos = min(min_cos, st.worst_row_cosine)
                if not ok:
                    failures.append(f"{case['module']}/{out['name']}: {reason}")
        mods.release_all()
        budget = policy.default(v.precision)
        rows.append({"variant": v.name, "precision": v.precision, "worst_rel_max_abs": worst_rel,
                     "min_worst_row_cosine": min_cos, "budget": budget.to_json(),
                     "passed": not failures, "failures": failures[:3]})
    return rows


def replay_table(rows: list[dict[str, Any]]) -> str:
    """The replay rows as a Markdown table under a line naming the machine (the ISA path)."""
    from ncnnport.runtime.machine import describe, machine_record

    lines = [f"machine: {describe(machine_record())}",
             "| variant | mode | worst max_abs/max|ref| (budget) | min worst-row cosine (budget) | gates |",
             "|---|---|---|---|---|"]
    for r in rows:
        b = r["budget"]
        lines.append(f"| {r['variant']} | {r['precision']} | {r['worst_rel_max_abs']:.3e} ({b['max_abs_rel']:.2e}) | "
                     f"{r['min_worst_row_cosine']:.7f} ({b['min_cosine']:.7f}) | "
                     f"{'PASS' if r['passed'] else 'FAIL: ' + '; '.join(r['failures'])} |")
    return "\n".join(lines)
