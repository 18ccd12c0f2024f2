"""The nightly gate: every model, every fixture, every precision mode, stability, regressions,
and the C++ runtime's parity rows (``parity --runtime cpp``) for every model with the hook.

Exit status is non-zero when any gate fails (fp32 parity, a precision mode's own budget, a
stability check) or when the run regressed against the last stored nightly summary.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from ncnnport.fsutil import read_json

STABILITY_ROUNDS = 100
MAX_DRIFT_PCT_PER_100 = 2.0
MAX_RSS_GROWTH_MB = 16.0


def full_parity(prep: Any, package: Path, user_inputs: Sequence[Path] = (), sweep_options: bool = True,
                precision: str = "fp32", official_ref: bool = False) -> dict:
    """Parity under ``precision`` (runtime.precision; judged by its policy mode) plus, optionally,
    the option sweep (each variant judged by its own budget)."""
    from ncnnport.drivers.parity import run_parity
    from ncnnport.parity.sweep import sweep
    from ncnnport.runtime import precision as precisions
    from ncnnport.drivers.bench import vulkan_available
    from ncnnport.stages import precision_package

    setting = precisions.get(precision)
    main_pkg = package if setting.package_name == "package" else precision_package(prep, setting)
    summary = run_parity(prep, main_pkg, user_inputs=user_inputs, options=setting.options(),
                         precision=setting.mode, official_ref=official_ref)
    if sweep_options:
        def run_variant(v):
            vsetting = precisions.get(v.setting)
            vpkg = package if vsetting.package_name == "package" else precision_package(prep, vsetting)
            return run_parity(prep, vpkg, user_inputs=user_inputs, options=v.options, precision=v.precision)
        summary["option_sweep"] = sweep(run_variant, gpu=vulkan_available(), budget=prep.policy.default)
        summary["gates_passed"] = summary["gates_passed"] and all(
            r["gates_passed"] for r in summary["option_sweep"]["variants"])
    return summary


def drift_exceeds(r: dict[str, Any]) -> bool:
    """``runtime.bench.BenchResult.slowed_down`` on a stored result: the aged/fresh pair ratio's
    lower 95% bound above 1 + limit x calls / 100 where a fresh session was compared; otherwise
    the lower end of the 95% interval must exceed the limit both for the raw time and for the
    stage/control ratio."""
    if r.get("aged_vs_fresh_low") is not None and r.get("aged_calls") is not None:
        return r["aged_vs_fresh_low"] > aged_limit(r)
    raw = r["drift_pct_per_100"] - r["drift_ci_pct_per_100"] > MAX_DRIFT_PCT_PER_100
    rel = (r.get("relative_drift_pct_per_100") is None
           or r["relative_drift_pct_per_100"] - r["relative_drift_ci_pct_per_100"] > MAX_DRIFT_PCT_PER_100)
    return raw and rel


def aged_limit(r: dict[str, Any]) -> float:
    """``runtime.bench.aged_limit`` for a stored result."""
    from ncnnport.runtime.bench import aged_limit as limit

    return limit(r["aged_calls"], r.get("fresh_vs_fresh_high"), MAX_DRIFT_PCT_PER_100)


def slowdown_text(r: dict[str, Any]) -> str:
    """What the drift verdict read, in the words of the check that decided it."""
    if r.get("aged_vs_fresh_ratio") is not None:
        return (f"after {r['aged_calls']} calls {r['aged_vs_fresh_ratio']:.3f}x the time of a fresh session "
                f"(95% interval {r['aged_vs_fresh_low']:.3f}-{r['aged_vs_fresh_high']:.3f}; limit "
                f"{aged_limit(r):.3f}: two fresh sessions differ up to {r.get('fresh_vs_fresh_high') or 1:.3f}, "
                f"times {MAX_DRIFT_PCT_PER_100}% per 100 calls)")
    return (f"drift {r['relative_drift_pct_per_100']:+.1f}%/100 calls relative to the control workload "
            f"(raw {r['drift_pct_per_100']:+.1f}%)")


def stability(prep: Any, package: Path, rounds: int = STABILITY_ROUNDS) -> dict[str, Any]:
    """Interleave every bench stage at its first size for ``rounds`` rounds; judge each."""
    from ncnnport.drivers.bench import run_interleave

    stages = prep.port.bench_stages()
    if not stages:
        return {"checked": False, "passed": True, "reason": "no bench stages"}
    pairs = [(s, sizes[0]) for s, sizes in stages.items()]
    results = run_interleave(prep, package, pairs, rounds, threads=1)
    problems = []
    for name, r in results.items():
        if not r["identical_outputs"]:
            problems.append(f"{name}: outputs changed at calls {r['mismatched_calls'][:5]}")
        if drift_exceeds(r):
            problems.append(f"{name}: {slowdown_text(r)}")
        if r["rss_growth_mb"] > MAX_RSS_GROWTH_MB:
            problems.append(f"{name}: RSS grew {r['rss_growth_mb']:.1f} MB")
    for r in results.values():
        r.pop("times_ms", None)
    return {"checked": True, "rounds": rounds, "results": results, "passed": not problems,
            "reason": "; ".join(problems)}


def cpp_unavailable(executable: str) -> str | None:
    """Why the C++ executable can neither be found nor built here (None: it is built, or
    ``make cpp`` can build it: cmake, g++ and make are on PATH)."""
    from ncnnport.drivers.cpp_parity import cpp_build_dir

    exe = cpp_build_dir() / executable
    if exe.is_file():
        return None
    missing = [tool for tool in ("cmake", "g++", "make") if shutil.which(tool) is None]
    if missing:
        return f"{exe} is not built and {', '.join(missing)} not found to build it (`make cpp`)"
    return None


def cpp_parity(prep: Any, package: Path) -> dict[str, Any]:
    """``parity --runtime cpp`` for the nightly: ``{"ran", "passed", "reason", "rows"}``. A model
    without the C++ hook, or a machine that can neither find nor build the executable, is skipped
    (``ran`` False, with the reason); an executable or build that fails is a failed row."""
    from ncnnport.drivers.cpp_parity import CppRuntimeError, run_cpp_parity

    executable = prep.port.cpp_executable
    if not executable:
        return {"ran": False, "passed": True, "reason": f"model {prep.target.model} has no C++ runtime", "rows": []}
    why = cpp_unavailable(executable)
    if why:
        return {"ran": False, "passed": True, "reason": why, "rows": []}
    try:
        cpp = run_cpp_parity(prep, package)
    except CppRuntimeError as exc:
        row = {"fixture": "*", "stage": "cpp runtime", "kind": "text", "runtime": "cpp", "gated": True,
               "passed": False, "reason": str(exc)}
        return {"ran": True, "passed": False, "reason": str(exc), "rows": [row]}
    return {"ran": True, "passed": cpp["gates_passed"], "reason": "", "rows": cpp["e2e"],
            "executable": cpp["executable"], "seconds": cpp["timings_s"]["cpp_e2e_s"]}


def add_cpp_rows(summary: dict[str, Any], cpp: dict[str, Any]) -> None:
    """The C++ rows (``runtime: "cpp"``) join the summary's e2e rows and its verdict; what ran
    or why it did not stays in ``summary["cpp"]``."""
    summary["e2e"] = list(summary.get("e2e", [])) + cpp["rows"]
    summary["cpp"] = {k: v for k, v in cpp.items() if k != "rows"}
    summary["gates_passed"] = summary["gates_passed"] and cpp["passed"]


def cpp_line(cpp: dict[str, Any]) -> str:
    """The nightly's one line on the C++ runtime."""
    if not cpp["ran"]:
        return f"cpp rows skipped: {cpp['reason']}"
    failed = [r for r in cpp["rows"] if not r["passed"]]
    if not failed:
        return f"cpp rows ({len(cpp['rows'])}): PASS"
    first = failed[0]
    return (f"cpp rows ({len(cpp['rows'])}): FAIL, {len(failed)} failed; first: {first['fixture']} "
            f"{first['stage']}: {first.get('reason') or 'failed'}")


def history_dir(store: Path, now: datetime | None = None) -> Path:
    """A new folder ``store/history/<UTC timestamp, microseconds>/`` for this run (names sort in
    time order), created exclusively: a clash gets ``-1``, ``-2``..., so no run's history is ever
    overwritten."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S.%fZ")
    root = store / "history"
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        folder = root / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{root}: 1000 nightly runs at {stamp}")


def run_nightly(targets: Sequence[Any], store: Path) -> int:
    from ncnnport.reports.compare import regressions
    from ncnnport.reports.summary import gate_table, write_report
    from ncnnport.stages import convert_stage, prepare

    failed = False
    history = history_dir(store)
    for t in targets:
        prep = prepare(t)
        pkg = convert_stage(prep)
        summary = full_parity(prep, pkg)
        summary["stability"] = stability(prep, pkg)
        summary["gates_passed"] = summary["gates_passed"] and summary["stability"]["passed"]
        cpp = cpp_parity(prep, pkg)
        add_cpp_rows(summary, cpp)
        last = store / t.model / "last_summary.json"
        found = regressions(read_json(last), summary) if last.is_file() else []
        summary["regressions"] = found
        path = write_report(summary, t.report_dir)
        ok = summary["gates_passed"] and not found
        print(f"\n## nightly {t.model}: {'PASSED' if ok else 'FAILED'}")
        print(gate_table(summary))
        if "option_sweep" in summary:
            from ncnnport.parity.sweep import sweep_table
            print("\n" + sweep_table(summary["option_sweep"]))
        stab = summary["stability"]
        print(f"\nstability ({stab.get('rounds', 0)} interleaved rounds): "
              f"{'PASS' if stab['passed'] else 'FAIL: ' + stab['reason']}")
        print(cpp_line(cpp))
        print(f"regressions vs last nightly: {len(found) if last.is_file() else 'no earlier nightly'}")
        for line in found:
            print(f"  - {line}")
        print(f"report: {path.parent / 'report.html'}")
        kept = history / t.model / "summary.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, kept)  # every run, passing or not; the folder is new, nothing is replaced
        print(f"history: {kept}")
        if ok:  # only a passing run becomes the baseline for the next night
            last.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, last)
        failed = failed or not ok
    return 1 if failed else 0
