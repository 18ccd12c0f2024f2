"""Local parity of every sweep variant replayed on another ISA path, without torch.

Why: a reduced-precision budget must hold on whichever ISA path ncnn picks (AVX2+F16C here,
AVX-512 FP16/BF16 or SSE-only elsewhere), and the way to show it on one machine is to run the
ncnn side under an emulated CPU (``qemu-x86_64 -cpu Nehalem``: no AVX, F16C or FMA), where
importing torch alone takes minutes. So the reference side is computed once, natively
(``dump``: each module's example inputs at every parity size and the torch outputs), and the
ncnn side runs anywhere on the dumped cases (``replay``: ncnn + numpy only), judged by the
policy's budget of each variant's precision mode.

    python -m ncnnport.parity.isa_replay dump qwen3-asr CASES            # native, needs torch
    qemu-x86_64 -cpu Nehalem .venv/bin/python -m ncnnport.parity.isa_replay replay \\
        build/qwen3-asr/tiny/package CASES models/qwen3_asr/policy.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ncnnport.metrics import compare, judge
from ncnnport.parity.policy import Policy
from ncnnport.parity.sweep import variants

INDEX = "cases.json"


def dump_cases(prep: Any, out: Path) -> int:
    """Write every module's parity-size inputs and torch outputs to ``out``; returns the count."""
    from ncnnport.parity.reproducible import deterministic_reference
    from ncnnport.runtime.lazy_modules import LazyTorchModules

    out.mkdir(parents=True, exist_ok=True)
    torch_mods = LazyTorchModules(prep.specs)
    index = []
    with deterministic_reference():
        for spec in prep.specs:
            for i, sizes in enumerate(spec.all_parity_sizes()):
                inputs = spec.example_inputs(sizes, seed=i)  # local parity's own inputs and seeds
                ref = torch_mods[spec.name].run(inputs)
                name = f"{spec.name}.{i}.npz"
                np.savez(out / name, **{f"in{k}": a for k, a in enumerate(inputs)},
                         **{f"ref{k}": r for k, r in enumerate(ref)})
                index.append({"file": name, "module": spec.name, "sizes": dict(sizes),
                              "outputs": [{"name": o.name, "feature_axis": o.feature_axis} for o in spec.outputs]})
            torch_mods.release(spec.name)
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return len(index)


def replay(package: Path, cases: Path, policy: Policy) -> list[dict[str, Any]]:
    """One row per sweep variant: worst relative max_abs and cosine over all cases, and whether
    every output is within the variant's precision budget (pnnx fp16 weights: the sibling
    ``package-fp16w`` when it exists)."""
    from ncnnport.runtime.lazy_modules import LazyModules

    index = json.loads((cases / INDEX).read_text())
    rows = []
    for v in variants(gpu=False):
        pkg = package.with_name("package-fp16w") if v.fp16_weights else package
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


def _print(rows: list[dict[str, Any]]) -> None:
    from ncnnport.runtime.machine import describe, machine_record

    print(f"machine: {describe(machine_record())}")
    print("| variant | mode | worst max_abs/max|ref| (budget) | min worst-row cosine (budget) | gates |")
    print("|---|---|---|---|---|")
    for r in rows:
        b = r["budget"]
        print(f"| {r['variant']} | {r['precision']} | {r['worst_rel_max_abs']:.3e} ({b['max_abs_rel']:.2e}) | "
              f"{r['min_worst_row_cosine']:.7f} ({b['min_cosine']:.7f}) | "
              f"{'PASS' if r['passed'] else 'FAIL: ' + '; '.join(r['failures'])} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ncnnport.parity.isa_replay", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="torch reference cases of a model's tiny preset (native)")
    d.add_argument("model")
    d.add_argument("cases", type=Path)
    r = sub.add_parser("replay", help="every sweep variant on the dumped cases (ncnn + numpy only)")
    r.add_argument("package", type=Path)
    r.add_argument("cases", type=Path)
    r.add_argument("policy", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "dump":
        from ncnnport.stages import prepare
        from ncnnport.targets import Target

        print(f"{dump_cases(prepare(Target(args.model)), args.cases)} cases in {args.cases}")
        return 0
    for path in (args.package / "manifest.json", args.cases / INDEX, args.policy):
        if not path.is_file():
            print(f"error: {path} not found", file=sys.stderr)
            return 2
    rows = replay(args.package, args.cases, Policy.load(args.policy))
    _print(rows)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
