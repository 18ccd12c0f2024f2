"""The ``bench`` verb: stability table over backends x sizes for one model stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ncnnport.runtime.bench import BenchResult, interleave, measure
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.vulkan import backend_label, device_for

HEADER = ("| model | stage | size | backend | runs | mean +- std (ms) | min (ms) | max (ms) | median (ms) "
          "| first call (ms) | drift %/100 calls (95% CI) | RSS growth (MB) | bitwise identical |")


def vulkan_available() -> bool:
    """A Vulkan device is present: a GPU or a software one (lavapipe). Tables name which one
    (``runtime.vulkan.backend_label``), so a software device is never read as GPU speed."""
    from ncnnport.runtime.vulkan import default_device

    return default_device() is not None


def backend_options(backend: str, threads: int) -> RuntimeOptions:
    if backend == "cpu":
        return RuntimeOptions(num_threads=threads)
    if backend == "vulkan":
        return RuntimeOptions(num_threads=threads, use_vulkan=True)
    raise ValueError(f"unknown backend {backend!r}: use cpu or vulkan")


def _drift(r: BenchResult) -> str:
    """Raw drift, and the drift relative to the interleaved control workload where one ran."""
    raw = f"{r.drift_pct_per_100:+.2f} (+-{r.drift_ci_pct_per_100:.2f})"
    if r.relative_drift_pct_per_100 is None:
        return raw
    return f"{raw}; vs control {r.relative_drift_pct_per_100:+.2f} (+-{r.relative_drift_ci_pct_per_100:.2f})"


def row(model: str, stage: str, size: str, backend: str, r: BenchResult) -> str:
    return (f"| {model} | {stage} | {size} | {backend} | {r.runs} | {r.mean_ms:.3f} +- {r.std_ms:.3f} | "
            f"{r.min_ms:.3f} | {r.max_ms:.3f} | {r.median_ms:.3f} | {r.first_call_ms:.2f} | "
            f"{_drift(r)} | {r.rss_growth_mb:+.2f} | "
            f"{'yes' if r.identical_outputs else 'NO ' + str(r.mismatched_calls[:5])} |")


def run_bench(prep: Any, package: Path, stages: Sequence[str], backends: Sequence[str],
              sizes: Sequence[str] | None, threads: int, warmup: int, runs: int) -> list[dict[str, Any]]:
    """Fresh sessions per (stage, backend, size), so the first call includes pipeline creation."""
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
                modules = open_ncnn_modules(package, options=backend_options(backend, threads))
                call = port.bench_call(prep.loaded, modules, stage, size)
                r = measure(f"{stage}@{size}", call, warmup=warmup, runs=runs)
                print(row(model, stage, size, backend_label(backend), r), flush=True)
                results.append({"model": model, "stage": stage, "size": size, "backend": backend,
                                "device": device_for(backend), "threads": threads, **r.to_json()})
    return results


def run_interleave(prep: Any, package: Path, pairs: Sequence[tuple[str, str]], rounds: int,
                   threads: int) -> dict[str, Any]:
    """Alternate several stages in one process (e.g. encoder and decode step)."""
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    calls = {}
    for stage, size in pairs:
        modules = open_ncnn_modules(package, options=RuntimeOptions(num_threads=threads))
        calls[f"{stage}@{size}"] = prep.port.bench_call(prep.loaded, modules, stage, size)
    res = interleave(calls, rounds=rounds)
    print(f"\ninterleaved {' <-> '.join(calls)} for {rounds} rounds:")
    print(HEADER)
    for name, r in res.items():
        print(row(prep.target.model, name.split("@")[0], name.split("@")[1], "cpu", r))
    return {name: r.to_json() for name, r in res.items()}


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
