"""ncnn vs PyTorch eager on the same work and thread count, medians of repeated runs.

The two runtimes are timed one after the other, never at once (two OpenMP pools on two cores
fight and distort both).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from ncnnport.runtime.options import RuntimeOptions


def median_ms(call, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def torch_ratio_table(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None,
                      threads: int, runs: int) -> list[dict[str, Any]]:
    import torch

    from ncnnport.stages import open_ncnn_modules

    torch.set_num_threads(threads)
    rows = []
    print(f"\n| model | stage | size | torch eager median (ms) | ncnn median (ms) | torch/ncnn | threads |")
    print("|---|---|---|---|---|---|---|")
    for stage in stages:
        for size in (sizes or prep.port.bench_stages()[stage]):
            tcall = prep.port.torch_bench_call(prep.loaded, stage, size)
            if tcall is None:
                continue
            modules = open_ncnn_modules(package, options=RuntimeOptions(num_threads=threads))
            ncall = prep.port.bench_call(prep.loaded, modules, stage, size)
            t_ms = median_ms(tcall, runs)
            n_ms = median_ms(ncall, runs)
            rows.append({"stage": stage, "size": size, "torch_ms": t_ms, "ncnn_ms": n_ms,
                         "ratio": t_ms / n_ms, "threads": threads})
            print(f"| {prep.target.model} | {stage} | {size} | {t_ms:.3f} | {n_ms:.3f} | {t_ms / n_ms:.2f}x | {threads} |",
                  flush=True)
    return rows
