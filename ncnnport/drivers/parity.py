"""Run local and end-to-end parity for one prepared model and collect the summary."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

from ncnnport.package.manifest import tool_versions
from ncnnport.fsutil import read_json, sha256_file
from ncnnport.parity.local import local_parity, variant_parity
from ncnnport.parity.reproducible import deterministic_reference
from ncnnport.registry import E2EContext
from ncnnport.runtime.options import FP32, RuntimeOptions
from ncnnport.runtime.lazy_modules import LazyModules, LazyTorchModules
from ncnnport.runtime.machine import machine_record
from ncnnport.stages import Prepared, log

SUMMARY_SCHEMA = 1


def run_parity(prep: Prepared, package: Path, user_inputs: Sequence[Path] = (),
               options: RuntimeOptions = FP32, precision: str = "fp32",
               skip_e2e: bool = False, official_ref: bool = False) -> dict[str, Any]:
    t = prep.target
    # Both sides open lazily and local parity releases each pair after use: at real size only one
    # module of each is resident during local parity (the e2e check opens what it needs).
    ncnn_mods = LazyModules(package, options=options)
    torch_mods = LazyTorchModules(prep.specs)
    default = prep.policy.default(precision)
    modules: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with deterministic_reference() as reference:  # torch threads matter only to the reference side
        for spec in prep.specs:
            log(f"{t.model}: local parity {spec.name} at {len(spec.all_parity_sizes())} sizes [{options.label}]")
            if precision != "fp32":  # a precision mode is judged by its own budgets
                spec = dataclasses.replace(spec, tolerances=prep.policy.module(spec.name, precision))
            modules += local_parity(spec, torch_mods[spec.name], ncnn_mods[spec.name], default)
            modules += variant_parity(spec, torch_mods[spec.name], ncnn_mods[spec.name], default)
            torch_mods.release(spec.name)
            ncnn_mods.release(spec.name)
    timings = {"local_s": time.perf_counter() - t0}
    e2e: list[dict[str, Any]] = []
    if not skip_e2e:
        t0 = time.perf_counter()
        ctx = E2EContext(loaded=prep.loaded, ncnn_modules=ncnn_mods, torch_modules=torch_mods,
                         package_dir=package, policy=prep.policy, user_inputs=list(user_inputs),
                         precision=precision)
        log(f"{t.model}: end-to-end parity")
        with deterministic_reference():
            for rec in prep.port.e2e_parity(ctx):
                # a model's e2e run may also yield local rows on inputs recorded from real data
                (modules if rec.get("kind") == "local" else e2e).append(rec)
        timings["e2e_s"] = time.perf_counter() - t0
        if official_ref:  # distance to the official package: reported next to the gates, not in them
            t0 = time.perf_counter()
            log(f"{t.model}: official reference")
            official = prep.port.official_reference(ctx)
            timings["official_ref_s"] = time.perf_counter() - t0
    manifest = package / "manifest.json"
    # an empty list is not a pass: a port whose e2e check returned nothing has proven nothing
    passed = (bool(modules) and (skip_e2e or bool(e2e)) and all(r["passed"] for r in modules)
              and all(r["passed"] for r in e2e))
    summary = {
        "schema": SUMMARY_SCHEMA,
        "model": t.model,
        "preset": t.preset if t.ckpt is None else None,
        "ckpt": str(Path(t.ckpt).name) if t.ckpt else None,
        "precision": precision,
        "runtime_options": options.to_json(),
        "gates_passed": passed,
        "policy": prep.policy.describe(),
        "modules": modules,
        "e2e": e2e,
        "versions": tool_versions(),
        "machine": machine_record(),
        "reference": reference,
        "manifest_sha256": sha256_file(manifest),
        "build_key": read_json(manifest)["build_key"],
        "memory": read_json(manifest).get("memory"),  # peak RSS per stage, from the convert receipts
        "timings_s": {**{k: round(v, 2) for k, v in prep.timings.items()},
                      **{k: round(v, 2) for k, v in timings.items()}},
    }
    if official_ref and not skip_e2e:
        summary["official_reference"] = official
    return summary


def run_streamed_parity(prep: Prepared, package: Path, user_inputs: Sequence[Path] = ()) -> dict[str, Any]:
    """The model's streamed full-depth parity (one module of each side resident at a time) in the
    summary schema: its records are propagated/local stage rows, its memory receipt is kept."""
    t = prep.target
    t0 = time.perf_counter()
    ctx = E2EContext(loaded=prep.loaded, ncnn_modules=LazyModules(package), torch_modules=LazyTorchModules(prep.specs),
                     package_dir=package, policy=prep.policy, user_inputs=list(user_inputs))
    log(f"{t.model}: streamed full-depth parity")
    with deterministic_reference() as reference:
        records, receipt = prep.port.streamed_parity(ctx)
    manifest = read_json(package / "manifest.json")
    summary = {
        "schema": SUMMARY_SCHEMA, "model": t.model, "mode": "streamed",
        "preset": t.preset if t.ckpt is None else None, "ckpt": str(Path(t.ckpt).name) if t.ckpt else None,
        "precision": "fp32", "runtime_options": FP32.to_json(),
        "gates_passed": bool(records) and all(r["passed"] for r in records),
        "policy": prep.policy.describe(), "modules": [], "e2e": records, "streamed": receipt,
        "versions": tool_versions(), "machine": machine_record(), "reference": reference,
        "manifest_sha256": sha256_file(package / "manifest.json"),
        "build_key": manifest["build_key"], "memory": manifest.get("memory"),
        "timings_s": {**{k: round(v, 2) for k, v in prep.timings.items()},
                      "streamed_s": round(time.perf_counter() - t0, 2)},
    }
