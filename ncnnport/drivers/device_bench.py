"""The device speed table of ``ncnnport bench MODEL --perf --backends cpu,vulkan --torch-device cuda``.

One row per bench stage, size and runtime: PyTorch eager on the CPU (the parity reference), on
each ``--torch-device``, and ncnn on each backend. Every row has the first call (pipeline
creation, weight upload) apart from the median and minimum of the timed runs, and the worst
cosine and max_abs / max|ref| of its outputs against the torch CPU outputs on the same inputs.
The work per stage is the port's own bench hooks (``bench_call``, ``torch_bench_call``), so a
model needs no script of its own to be timed on a GPU. Where a port's two calls do the same work
on different inputs (``bench_unmatched``: the LLM decode stages fill their K/V caches two ways),
the ncnn rows say so instead of printing a cosine between unrelated numbers (the H200 table read
cosine -0.007 for qwen3-asr decode, on CPU and Vulkan alike).

What the numbers include: ncnn calls take numpy in and out (host<->device copies inside every
Vulkan call); a torch device call keeps its tensors on the device and synchronises per call,
then copies the outputs back for the parity columns (outside the timed region only for the
first call, which is not a timed run).
"""

from __future__ import annotations

import inspect
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ncnnport.drivers.bench import backend_options, vulkan_available
from ncnnport.metrics import compare
from ncnnport.runtime.lazy_modules import open_ncnn_modules
from ncnnport.runtime.perf_timing import interleaved_ms, timed_ms

HEADER = ("| model | stage | size | runtime | median (ms) | min (ms) | runs | first call (ms) "
          "| cosine vs torch cpu | max_abs/max|ref| | note |")


def takes_device(port: Any) -> bool:
    """Whether the port's ``torch_bench_call`` accepts ``device`` (runs torch off the CPU)."""
    return "device" in inspect.signature(port.torch_bench_call).parameters


def device_missing(device: str) -> str | None:
    """Why torch cannot run on ``device`` here (None when it can)."""
    import torch

    kind = device.split(":", 1)[0]
    if kind == "cuda" and not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if kind not in ("cpu", "cuda", "mps", "xpu"):
        return f"unknown torch device {device!r}"
    return None


def worst_parity(ref: Sequence[np.ndarray], outs: Sequence[Any]) -> tuple[float, float]:
    """Worst (cosine, max_abs / max|ref|) over a call's outputs; an output with the reference's
    element count is compared in the reference's shape (ncnn keeps a leading batch axis)."""
    if len(ref) != len(outs):
        raise ValueError(f"{len(outs)} outputs vs {len(ref)} in the torch cpu reference")
    cos, rel = 1.0, 0.0
    for i, (r, o) in enumerate(zip(ref, outs)):
        o = np.asarray(o)
        o = o.reshape(r.shape) if o.size == r.size else o
        s = compare(r, o, what=f"output {i}")
        bad = s.nan + s.inf
        cos = float("nan") if bad else min(cos, s.cosine)
        rel = float("inf") if bad else max(rel, s.max_abs / max(s.ref_absmax, 1e-30))
    return cos, rel


def time_call(call: Callable[[], Sequence[Any]], warmup: int, runs: int) -> dict[str, Any]:
    """First call (kept, as numpy, for parity), ``warmup - 1`` more untimed calls, ``runs`` timed
    (the speed tables' one loop, ``runtime/perf_timing.py``)."""
    first_ms, outs = timed_ms(call)
    first = [np.asarray(o) for o in outs]
    times = interleaved_ms([call], runs, max(warmup - 1, 0))[0] if runs > 0 else []
    return {"outputs": first, "first_ms": first_ms, "median_ms": statistics.median(times) if times else None,
            "min_ms": min(times) if times else None, "runs": len(times)}


def _row(model: str, stage: str, size: str, runtime: str, timed: dict[str, Any] | None,
         ref: Sequence[np.ndarray] | None, note: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "stage": stage, "size": size, "runtime": runtime, "median_ms": None,
                           "min_ms": None, "runs": 0, "first_ms": None, "cos_vs_torch_cpu": None,
                           "rel_vs_torch_cpu": None, "note": note}
    if timed is not None:
        row.update({k: timed[k] for k in ("median_ms", "min_ms", "runs", "first_ms")})
        if ref is not None:
            row["cos_vs_torch_cpu"], row["rel_vs_torch_cpu"] = worst_parity(ref, timed["outputs"])
    return row


def format_row(r: dict[str, Any]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    return (f"| {r['model']} | {r['stage']} | {r['size']} | {r['runtime']} | {num(r['median_ms'], '.3f')} | "
            f"{num(r['min_ms'], '.3f')} | {r['runs']} | {num(r['first_ms'], '.1f')} | "
            f"{num(r['cos_vs_torch_cpu'], '.7f')} | {num(r['rel_vs_torch_cpu'], '.2e')} | {r['note']} |")


def _emit(rows: list[dict[str, Any]], row: dict[str, Any]) -> None:
    rows.append(row)
    print(format_row(row), flush=True)


def device_table(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None,
                 backends: Sequence[str], torch_devices: Sequence[str], threads: int, warmup: int,
                 runs: int, stage_sizes: dict[str, list[str]], precision: str = "fp32") -> list[dict[str, Any]]:
    """Rows of the device table (printed as they are measured). A torch device the port cannot
    serve is one error naming the model; a device or backend this machine lacks is a skipped row.
    ncnn runs under ``precision`` (its parity columns then show what that precision costs)."""
    import torch

    port, loaded, model = prep.port, prep.loaded, prep.target.model
    others = [d for d in torch_devices if d != "cpu"]
    if others and not takes_device(port):
        raise ValueError(f"model {model}: its torch_bench_call takes no device, so --torch-device "
                         f"{','.join(others)} cannot run it")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    try:
        for stage in stages:
            for size in (sizes or stage_sizes[stage]):
                make_ref = port.torch_bench_call(loaded, stage, size)
                if make_ref is None:
                    _emit(rows, _row(model, stage, size, "torch eager cpu", None, None, "no torch call for this stage"))
                    continue
                ref_timed = time_call(make_ref, warmup, runs)
                del make_ref
                ref = ref_timed["outputs"]
                _emit(rows, _row(model, stage, size, f"torch eager cpu t{threads}", ref_timed, None, "parity reference"))
                unmatched = port.bench_unmatched(stage)  # ncnn's call then runs other inputs: no parity
                ncnn_ref, ncnn_note = (None, f"not compared: {unmatched}") if unmatched else (ref, "")
                for dev in others:
                    missing = device_missing(dev)
                    if missing:
                        _emit(rows, _row(model, stage, size, f"torch eager {dev}", None, None, f"skipped: {missing}"))
                        continue
                    _emit(rows, _row(model, stage, size, f"torch eager {dev}",
                                     time_call(port.torch_bench_call(loaded, stage, size, device=dev), warmup, runs), ref))
                for backend in backends:
                    if backend != "cpu" and not vulkan_available():
                        _emit(rows, _row(model, stage, size, f"ncnn {backend}", None, None,
                                         "skipped: no Vulkan GPU on this machine"))
                        continue
                    modules = open_ncnn_modules(package, options=backend_options(backend, threads, precision))
                    timed = time_call(port.bench_call(loaded, modules, stage, size), warmup, runs)
                    del modules
                    _emit(rows, _row(model, stage, size, f"ncnn {backend} t{threads}", timed, ncnn_ref, ncnn_note))
    finally:
        torch.set_num_threads(threads_before)
    return rows
