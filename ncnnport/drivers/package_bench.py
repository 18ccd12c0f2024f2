"""Bench and cross-check a converted package by itself: no model code, no torch.

Users run this on their own ports and on machines that only have ncnn (a phone build farm, a
GPU box): inputs come from each graph's spec JSON at its trace sizes, every module is timed on
each backend with the repeated-call checks (first call, drift, RSS, bitwise identity), and the
outputs of every backend are compared with the CPU fp32 outputs on the same inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ncnnport.contract import tensor_specs_from_json
from ncnnport.fsutil import read_json
from ncnnport.metrics import compare
from ncnnport.runtime.bench import measure
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.vulkan import backend_label, default_device, device_for
from ncnnport.runtime.vulkan_fallback import census


def spec_inputs(spec: dict[str, Any], which: int = 1, seed: int = 0) -> list[np.ndarray]:
    """Inputs at trace size ``which`` (0 or 1): normal noise, int32 ids in [0, 16), zero masks."""
    sizes = {a: (v[which] if v[which] is not None else v[0]) for a, v in spec["axes"].items()}
    rng = np.random.default_rng(seed)
    out = []
    for t in tensor_specs_from_json(spec["inputs"]):
        shape = t.concrete(sizes)
        if t.dtype == "int32":
            out.append(rng.integers(0, 16, size=shape).astype(np.int32))
        elif "mask" in t.name:
            out.append(np.zeros(shape, np.float32))  # additive mask: attend everywhere
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


def print_vulkan_fallback(package: Path, names: Sequence[str]) -> dict[str, Any]:
    """The census (``runtime.vulkan_fallback``) of each graph, printed as a table: which layers
    a Vulkan run leaves on the CPU and how many host syncs that costs per call. Needs no GPU."""
    print("| module | layers | Vulkan run: layers on the CPU | host syncs per call |")
    print("|---|---|---|---|")
    found = {}
    for name in names:
        c = found[name] = census(package / "ncnn" / f"{name}.ncnn.param")
        kinds = ", ".join(f"{t} x{n}" for t, n in sorted(c.cpu_layers.items())) or "none"
        print(f"| {name} | {c.layers} | {kinds} | {c.syncs} |")
    print()
    return found


def bench_package(package: Path, backends: Sequence[str], threads: int = 1, warmup: int = 3,
                  runs: int = 20, modules: Sequence[str] | None = None) -> list[dict[str, Any]]:
    from ncnnport.drivers.bench import backend_options, vulkan_available
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    specs = {p.name[:-len(".spec.json")]: read_json(p) for p in sorted((package / "specs").glob("*.spec.json"))}
    names = list(modules) if modules else list(specs)
    rows = []
    if "vulkan" in backends and default_device() is not None:
        print(f"vulkan device: {default_device().describe()}")
    fallback = print_vulkan_fallback(package, names) if "vulkan" in backends else {}
    print("| module | backend | runs | median (ms) | mean +- std (ms) | first call (ms) | drift %/100 (95% CI) "
          "| RSS growth (MB) | identical | cosine vs cpu | max_abs/max|cpu| |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cpu_out: dict[str, list[np.ndarray]] = {}
    for backend in backends:
        if backend == "vulkan" and not vulkan_available():
            print("| * | vulkan | skipped: no Vulkan device |")
            continue
        opts: RuntimeOptions = backend_options(backend, threads)
        mods = open_ncnn_modules(package, names, options=opts)
        for name in names:
            inputs = spec_inputs(specs[name])
            mod = mods[name]
            r = measure(name, lambda: mod.run(inputs), warmup=warmup, runs=runs)
            out = mod.run(inputs)
            if backend == "cpu":
                cpu_out[name] = out
            cos = rel = None
            if name in cpu_out:
                stats = [compare(c, o) for c, o in zip(cpu_out[name], out)]
                cos = min(s.cosine for s in stats)
                rel = max(s.max_abs / max(s.ref_absmax, 1e-30) for s in stats)
            print(f"| {name} | {backend_label(backend)} | {r.runs} | {r.median_ms:.3f} | {r.mean_ms:.3f} +- {r.std_ms:.3f} | "
                  f"{r.first_call_ms:.2f} | {r.drift_pct_per_100:+.1f} (+-{r.drift_ci_pct_per_100:.1f}) | "
                  f"{r.rss_growth_mb:+.2f} | {'yes' if r.identical_outputs else 'NO'} | "
                  f"{'-' if cos is None else f'{cos:.7f}'} | {'-' if rel is None else f'{rel:.2e}'} |", flush=True)
            row = {"module": name, "backend": backend, "device": device_for(backend), **r.to_json(), "cosine_vs_cpu": cos,
                   "rel_max_abs_vs_cpu": rel}
            row.pop("times_ms", None)
            if backend == "vulkan":
                row["vulkan_fallback"] = fallback[name].to_json()
            rows.append(row)
    return rows
