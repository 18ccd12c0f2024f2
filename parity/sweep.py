"""Option attribution: rerun parity under each ncnn runtime option (and pnnx fp16 weights) and
report each option's error against the fp32 run and which option first breaks its gate.

Variants are ordered from the most to the least conservative, so "the first option that breaks
a gate" reads as "how far you can push precision before the port stops being faithful". Each
variant is judged by its own precision mode's budgets from the model's policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ncnnport.contract import Tolerance
from ncnnport.runtime.machine import describe, machine_record
from ncnnport.runtime import precision
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.vulkan import device_for


@dataclass(frozen=True)
class Variant:
    name: str
    options: RuntimeOptions
    precision: str            # the policy's precision mode that judges it
    fp16_weights: bool = False
    setting: str = "fp32"     # the ``--precision`` name (runtime.precision) this row runs


def _variant(setting: str, base: RuntimeOptions = RuntimeOptions(), label: str | None = None) -> Variant:
    """The sweep row of one ``--precision`` name, so a row means what the CLI option means."""
    p = precision.get(setting)
    return Variant(label or p.name, p.options(base), precision.judging_mode(p, base.use_vulkan),
                   p.fp16_weights, p.name)


def variants(gpu: bool) -> list[Variant]:
    base = RuntimeOptions()
    out = [_variant("fp32", base, "fp32 threads=1"), _variant("fp32", base.with_(num_threads=2), "fp32 threads=2")]
    out += [_variant(name, base) for name in precision.NAMES if name != "fp32"]
    if gpu:  # any Vulkan device, software (lavapipe) included; each judged by its own Vulkan budget
        gpu_base = base.with_(use_vulkan=True)
        out.insert(2, _variant("fp32", gpu_base, "vulkan fp32"))
        out.append(_variant("fp16-arithmetic", gpu_base, "vulkan fp16-arithmetic"))
    return out


def _run_or_failure(run_variant: Callable[[Variant], dict[str, Any]], v: Variant) -> dict[str, Any]:
    """The variant's parity summary, or a failed one naming the option when ncnn raised (a Vulkan
    pipeline that cannot be created must be a failing row, not the end of the sweep)."""
    try:
        return run_variant(v)
    except Exception as exc:  # noqa: BLE001 - any ncnn/runtime error is this option's failure
        row = {"name": type(exc).__name__, "output": v.name, "passed": False,
               "reason": f"option {v.name} ({v.options.label}): {exc}"}
        return {"modules": [row], "e2e": [], "gates_passed": False}


def _worst(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst ncnn-computed error (local module rows; host-side stages are option-independent)."""
    tensors = [r for r in records if "max_abs" in r and r.get("ref_absmax") is not None and "name" in r]
    toks = [r for r in records if r.get("kind") == "tokens" and r["stage"] == "tokens"]
    worst = max(tensors, key=lambda r: r["max_abs"] / max(r["ref_absmax"], 1e-30), default=None)
    return {
        "worst_rel_max_abs": None if worst is None else worst["max_abs"] / max(worst["ref_absmax"], 1e-30),
        "worst_at": None if worst is None else f"{worst.get('name', worst.get('fixture'))}/"
                                               f"{worst.get('output', worst.get('stage'))}",
        "min_cosine": min((r["cosine"] for r in tensors), default=None),
        "tokens_matched": sum(r["tokens_matched"] for r in toks),
        "tokens_compared": sum(r["tokens_compared"] for r in toks),
        "teacher_forced_top1_min": min((r["teacher_forced"]["top1_agreement"] for r in toks
                                        if r.get("teacher_forced")), default=None),
        "teacher_forced_kl_max": max((r["teacher_forced"]["kl_mean"] for r in toks
                                      if r.get("teacher_forced")), default=None),
    }


def sweep(run_variant: Callable[[Variant], dict[str, Any]], gpu: bool,
          budget: Callable[[str], Tolerance] | None = None) -> dict[str, Any]:
    """``run_variant(v)`` returns a parity summary for variant ``v`` (judged in ``v.precision``);
    ``budget(precision)`` (the policy's default gate of that mode) is recorded beside each row."""
    rows = []
    baseline = None
    for v in variants(gpu):
        summary = _run_or_failure(run_variant, v)
        failing = [r for r in summary["modules"] + summary["e2e"] if not r["passed"]]
        row = {"variant": v.name, "precision_mode": v.precision, "options": v.options.to_json(),
               "fp16_weights": v.fp16_weights, "gates_passed": summary["gates_passed"],
               "failed_gates": len(failing),
               "device": device_for("vulkan" if v.options.use_vulkan else "cpu"),
               "first_failure": None if not failing else
               f"{failing[0].get('name', failing[0].get('fixture'))}/"
               f"{failing[0].get('output', failing[0].get('stage'))} under {v.name}: "
               f"{failing[0].get('reason', '')}",
               **_worst(summary["modules"] + summary["e2e"]),
               "budget": None if budget is None else budget(v.precision).to_json()}
        if baseline is None:
            baseline = row
        row["rel_error_vs_fp32"] = (None if not row["worst_rel_max_abs"] or not baseline["worst_rel_max_abs"]
                                    else row["worst_rel_max_abs"] / baseline["worst_rel_max_abs"])
        rows.append(row)
    first_break = next((r["variant"] for r in rows if not r["gates_passed"]), None)
    return {"variants": rows, "first_breaking_option": first_break, "machine": machine_record()}


def sweep_table(result: dict[str, Any]) -> str:
    lines = [f"machine: {describe(result['machine'])}" if "machine" in result else "",
             "vulkan rows ran on: " + vulkan_device_text(result["variants"]),
             "| option | precision budget | worst local max_abs/max|ref| (budget) | x fp32 | min cosine (budget) "
             "| greedy tokens | teacher-forced top-1 (min) | KL mean (max) | gates |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["variants"]:
        rel = "-" if r["worst_rel_max_abs"] is None else f"{r['worst_rel_max_abs']:.3e}"
        ratio = "-" if r["rel_error_vs_fp32"] is None else f"{r['rel_error_vs_fp32']:.1f}"
        cos = "-" if r["min_cosine"] is None else f"{r['min_cosine']:.7f}"
        gates = "PASS" if r["gates_passed"] else f"FAIL ({r['failed_gates']}): {r['first_failure'][:120]}"
        top1 = "-" if r["teacher_forced_top1_min"] is None else f"{r['teacher_forced_top1_min']:.3f}"
        kl = "-" if r["teacher_forced_kl_max"] is None else f"{r['teacher_forced_kl_max']:.2e}"
        b = r.get("budget")
        if b:
            rel, cos = f"{rel} ({b['max_abs_rel']:.2e})", f"{cos} ({b['min_cosine']:.7f})"
        lines.append(f"| {option_label(r)} | {r['precision_mode']} | {rel} | {ratio} | {cos} | "
                     f"{r['tokens_matched']}/{r['tokens_compared']} | {top1} | {kl} | {gates} |")
    lines.append(f"\nfirst option that breaks a gate: {result['first_breaking_option'] or 'none'}")
    return "\n".join(lines)


def option_label(row: dict[str, Any]) -> str:
    """A sweep row's option cell; a Vulkan row names its device kind (software is never a GPU)."""
    dev = row.get("device")
    return row["variant"] if not dev else f"{row['variant']} [{dev['label']}]"


def vulkan_device_text(rows: list[dict[str, Any]]) -> str:
    """Which Vulkan device the sweep's Vulkan rows ran on (name, type, driver), or why none ran."""
    dev = next((r["device"] for r in rows if r.get("device")), None)
    if dev is None:
        return "no Vulkan device (Vulkan rows not run)"
    return f"{dev['label']}: {dev['name']}, {dev['type']}, {dev['vendor']} driver {dev['driver_version']}"
