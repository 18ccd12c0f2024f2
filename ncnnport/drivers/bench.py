"""The ``bench`` verb: stability table over backends x sizes for one model stage.

``--precision`` is the vocabulary of ``run`` and ``parity`` (runtime/precision.py): the graphs
are opened under that precision's ncnn options (on the fp16-weights package where it says so),
so a bench stage is the same work as the run it times. A reduced precision never reports a speed
without its fidelity: each stage's first output is compared once with the fp32 graphs on the same
inputs, judged by the policy budget of the precision's mode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ncnnport.runtime import precision as precisions
from ncnnport.runtime.bench import BenchResult, interleave, measure, print_fidelity
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.vulkan import backend_label, device_for

HEADER = ("| model | stage | size | backend | runs | mean +- std (ms) | min (ms) | max (ms) | median (ms) "
          "| first call (ms) | drift %/100 calls (95% CI) | RSS growth (MB) | bitwise identical |")


def vulkan_available() -> bool:
    """A Vulkan device is present: a GPU or a software one (lavapipe). Tables name which one
    (``runtime.vulkan.backend_label``), so a software device is never read as GPU speed."""
    from ncnnport.runtime.vulkan import default_device

    return default_device() is not None


def backend_options(backend: str, threads: int, precision: str = "fp32") -> RuntimeOptions:
    """The ncnn options of one bench row: backend and threads are the bench's, the precision
    flags are exactly those ``--precision`` names (the same as ``run --precision``)."""
    if backend == "cpu":
        base = RuntimeOptions(num_threads=threads)
    elif backend == "vulkan":
        base = RuntimeOptions(num_threads=threads, use_vulkan=True)
    else:
        raise ValueError(f"unknown backend {backend!r}: use cpu or vulkan")
    return precisions.get(precision).options(base)


def check_fidelity(prep: Any, reference_package: Path, stage: str, size: str, got: Any,
                   precision: str, threads: int) -> bool | None:
    """A reduced-precision stage's first output against the fp32 graphs of ``reference_package``
    on the same inputs, printed and judged by the policy's budget for the precision's mode;
    None (nothing printed) under fp32, where there is nothing to compare against."""
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    setting = precisions.get(precision)
    if setting.name == "fp32":
        return None
    fp32 = open_ncnn_modules(reference_package, options=RuntimeOptions(num_threads=threads))
    ref = prep.port.bench_call(prep.loaded, fp32, stage, size)()[0]
    return print_fidelity(prep.target.model, f"{stage}[{setting.name}]", size, got[0], ref,
                          prep.policy.default(setting.mode))


def _drift(r: BenchResult) -> str:
    """Raw drift, the drift relative to the interleaved control workload where one ran, and the
    aged/fresh session ratio where one was measured."""
    raw = f"{r.drift_pct_per_100:+.2f} (+-{r.drift_ci_pct_per_100:.2f})"
    if r.relative_drift_pct_per_100 is not None:
        raw += f"; vs control {r.relative_drift_pct_per_100:+.2f} (+-{r.relative_drift_ci_pct_per_100:.2f})"
    if r.aged_vs_fresh_ratio is not None:
        raw += (f"; aged/fresh {r.aged_vs_fresh_ratio:.3f} "
                f"[{r.aged_vs_fresh_low:.3f}, {r.aged_vs_fresh_high:.3f}] (fresh/fresh up to "
                f"{r.fresh_vs_fresh_high:.3f})")
    return raw


def row(model: str, stage: str, size: str, backend: str, r: BenchResult) -> str:
    return (f"| {model} | {stage} | {size} | {backend} | {r.runs} | {r.mean_ms:.3f} +- {r.std_ms:.3f} | "
            f"{r.min_ms:.3f} | {r.max_ms:.3f} | {r.median_ms:.3f} | {r.first_call_ms:.2f} | "
            f"{_drift(r)} | {r.rss_growth_mb:+.2f} | "
            f"{'yes' if r.identical_outputs else 'NO ' + str(r.mismatched_calls[:5])} |")


def run_bench(prep: Any, package: Path, stages: Sequence[str], backends: Sequence[str],
              sizes: Sequence[str] | None, threads: int, warmup: int, runs: int,
              precision: str = "fp32", reference_package: Path | None = None) -> list[dict[str, Any]]:
    """Fresh sessions per (stage, backend, size), so the first call includes pipeline creation.
    ``reference_package`` holds the fp32 graphs a reduced precision is judged against (default:
    ``package``; the fp16-weights package differs)."""
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    port, model = prep.port, prep.target.model
    known = port.bench_stages()
    results = []
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for stage in stages:
        if stage not in known:
            raise ValueError(f"model {model}: no bench stage {stage!r}; known: {', '.join(known) or 'none'}")
        for backend in backends:
            if backend == "vulkan" and not vulkan_available():
                print(f"| {model} | {stage} | - | vulkan | skipped: no Vulkan device on this machine |")
                continue
            for size in (sizes or known[stage]):
                modules = open_ncnn_modules(package, options=backend_options(backend, threads, precision))
                call = port.bench_call(prep.loaded, modules, stage, size)
                r = measure(f"{stage}@{size}", call, warmup=warmup, runs=runs)  # first call timed
                within = check_fidelity(prep, reference_package or package, stage, size, call(),
                                        precision, threads) if backend == "cpu" else None
                print(row(model, stage, size, backend_label(backend), r), flush=True)
                results.append({"model": model, "stage": stage, "size": size, "backend": backend,
                                "device": device_for(backend), "threads": threads, "precision": precision,
                                **({} if within is None else {"within_budget": within}), **r.to_json()})
    return results


def run_interleave(prep: Any, package: Path, pairs: Sequence[tuple[str, str]], rounds: int,
                   threads: int, precision: str = "fp32") -> dict[str, Any]:
    """Alternate several stages in one process (e.g. encoder and decode step)."""
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    def session(stage: str, size: str) -> Any:
        modules = open_ncnn_modules(package, options=backend_options("cpu", threads, precision))
        return prep.port.bench_call(prep.loaded, modules, stage, size)

    calls = {f"{stage}@{size}": session(stage, size) for stage, size in pairs}
    # a fresh session per stage, opened after the rounds, is the aged one's load-immune control
    fresh = {f"{stage}@{size}": (lambda stage=stage, size=size: session(stage, size)) for stage, size in pairs}
    res = interleave(calls, rounds=rounds, fresh=fresh)
    print(f"\ninterleaved {' <-> '.join(calls)} for {rounds} rounds:")
    print(HEADER)
    for name, r in res.items():
        print(row(prep.target.model, name.split("@")[0], name.split("@")[1], "cpu", r))
    return {name: r.to_json() for name, r in res.items()}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
