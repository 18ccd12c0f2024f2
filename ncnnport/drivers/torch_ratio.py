"""ncnn vs PyTorch eager on the same work and thread count, medians of repeated runs, and both
against the memory-bandwidth bound measured in the same run.

The two runtimes are timed one after the other, never at once (two OpenMP pools on two cores
fight and distort both). The bound: a call must read at least its weights (plus its K/V cache)
once, so ``bytes / read bandwidth`` is the fastest it can possibly be on this machine; the
bandwidth is measured right before the table with a numpy reduction over an array far larger
than any cache, because it swings minute to minute on a shared host.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the body and restored on exit, error
    or not: the table times torch on the bench's thread count, and a nightly that benches one
    model must not leave the next model's reference on that count."""
    import torch

    if threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def median_ms(call, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def read_bandwidth(n_bytes: int = 256 << 20, runs: int = 7) -> dict[str, float]:
    """Memory read bandwidth in GB/s (1e9 B/s) over a float32 array of ``n_bytes``, median of
    ``runs`` per kernel, at the current thread settings.

    Several one-pass reductions are timed because a single one can be compute-bound instead of
    memory-bound (numpy's pairwise float32 ``sum`` measured ~16 GB/s here while ``max`` and a
    dot product read the same array at ~22-24 GB/s and torch's ``sum`` at ~36 GB/s). ``read_gbps``
    is the FASTEST kernel, so ``bytes / read_gbps`` is a lower bound on any runtime's time;
    ``copy_gbps`` (np.copyto, read + write counted) is reported beside it.
    """
    a = np.ones(n_bytes // 4, dtype=np.float32)
    ones = np.ones_like(a)
    kernels = {"numpy_sum": a.sum, "numpy_max": a.max, "numpy_dot": lambda: np.dot(a, ones)}
    try:
        import torch
        ta = torch.from_numpy(a)
        kernels["torch_sum"] = ta.sum
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    out: dict[str, float] = {"array_mb": n_bytes / 2**20}
    for name, kernel in kernels.items():
        kernel()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            kernel()
            times.append(time.perf_counter() - t)
        bytes_read = 2 * n_bytes if name == "numpy_dot" else n_bytes
        out[f"{name}_gbps"] = bytes_read / statistics.median(times) / 1e9
    del ones
    b = np.empty_like(a)
    np.copyto(b, a)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    out["copy_gbps"] = 2 * n_bytes / statistics.median(times) / 1e9
    out["read_gbps"] = max(v for k, v in out.items() if k.endswith("_gbps") and k != "copy_gbps")
    return out


def huge_pages_malloc() -> bool:
    """Whether glibc's malloc was told to back large allocations with transparent huge pages
    (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, read once at process start). It changes both the
    runtimes and the bandwidth measured here, so every speed table says which it was."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(t.strip() in ("glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=2") for t in tunables.split(":"))


def bound_row(ncnn_ms: float, torch_ms: float | None, nbytes: dict[str, int] | None,
              bandwidth_gbps: float) -> dict[str, Any]:
    """Bound columns for one timed stage: bytes per call, the bound in ms (weights only and
    weights + K/V cache) and each runtime's percentage of it (100% = at the bandwidth limit)."""
    if not nbytes:
        return {}
    weights = int(nbytes.get("weights", 0))
    total = weights + int(nbytes.get("kv_cache", 0))
    bound_w = weights / (bandwidth_gbps * 1e9) * 1e3
    bound_all = total / (bandwidth_gbps * 1e9) * 1e3
    row = {"weight_bytes": weights, "kv_bytes": total - weights, "bound_weights_ms": bound_w,
           "bound_ms": bound_all, "ncnn_pct_of_bound": 100 * bound_w / ncnn_ms,
           "ncnn_pct_of_bound_with_kv": 100 * bound_all / ncnn_ms}
    if torch_ms:
        row["torch_pct_of_bound"] = 100 * bound_w / torch_ms
    return row


def torch_ratio_table(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None,
                      threads: int, runs: int, stage_sizes: dict[str, list[str]] | None = None,
                      precision: str = "fp32", reference_package: Path | None = None
                      ) -> list[dict[str, Any]]:
    """One row per (stage, size): medians, torch/ncnn ratio and, where the port knows the bytes a
    call reads, the bandwidth bound columns (``read_gbps`` of this run in every row). ncnn runs
    under ``precision`` (judged once against the fp32 graphs of ``reference_package``); torch is
    always eager fp32, so the ratio says what the precision buys over the reference. torch's
    thread count is the bench's for the table only."""
    with torch_threads(threads):
        return _table(prep, package, stages, sizes, threads, runs, stage_sizes, precision,
                      reference_package or package)


def _table(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None, threads: int,
           runs: int, stage_sizes: dict[str, list[str]] | None, precision: str,
           reference_package: Path) -> list[dict[str, Any]]:
    from ncnnport.drivers.bench import backend_options, check_fidelity
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    known = stage_sizes or prep.port.bench_stages()
    bw = read_bandwidth()
    kernels = ", ".join(f"{k[:-5]} {v:.1f}" for k, v in bw.items() if k.endswith("_gbps") and k != "read_gbps")
    huge = huge_pages_malloc()
    print(f"\nread bandwidth over {bw['array_mb']:.0f} MB, {threads} thread(s): {bw['read_gbps']:.1f} GB/s "
          f"(fastest of: {kernels} GB/s); malloc huge pages: {'on' if huge else 'off'}; ncnn --precision {precision}")
    rows = []
    print("\n| model | stage | size | torch eager median (ms) | ncnn median (ms) | torch/ncnn | weight MB "
          "| bound (ms) | ncnn % of bound | torch % of bound | ncnn % of bound incl. K/V | threads |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for stage in stages:
        for size in (sizes or known[stage]):
            tcall = prep.port.torch_bench_call(prep.loaded, stage, size)
            if tcall is None:
                continue
            t_ms = median_ms(tcall, runs)
            del tcall
            modules = open_ncnn_modules(package, options=backend_options("cpu", threads, precision))
            ncall = prep.port.bench_call(prep.loaded, modules, stage, size)
            within = check_fidelity(prep, reference_package, stage, size, ncall(), precision, threads)
            n_ms = median_ms(ncall, runs)
            del ncall, modules
            extra = bound_row(n_ms, t_ms, prep.port.bench_bytes(prep.loaded, stage, size, precision),
                              bw["read_gbps"])
            rows.append({"stage": stage, "size": size, "torch_ms": t_ms, "ncnn_ms": n_ms,
                         "ratio": t_ms / n_ms, "threads": threads, "precision": precision, "bandwidth": bw,
                         "huge_pages_malloc": huge, **({} if within is None else {"within_budget": within}),
                         **extra})
            if extra:
                cols = (f"{extra['weight_bytes'] / 2**20:.0f} | {extra['bound_weights_ms']:.2f} | "
                        f"{extra['ncnn_pct_of_bound']:.0f}% | {extra['torch_pct_of_bound']:.0f}% | "
                        f"{extra['ncnn_pct_of_bound_with_kv']:.0f}%")
            else:
                cols = "- | - | - | - | -"
            print(f"| {prep.target.model} | {stage} | {size} | {t_ms:.3f} | {n_ms:.3f} | {t_ms / n_ms:.2f}x | "
                  f"{cols} | {threads} |", flush=True)
    return rows
