"""ncnn vs PyTorch eager (and ONNX Runtime, the peer a PC user would pick) on the same work and
thread count, timed INTERLEAVED call by call, and each against the memory-bandwidth bound
measured in the same run.

Interleaving (``runtime/perf_timing.py``): every round calls torch, ncnn and the peer once each
(rotating which goes first), so a load change on a shared machine hits every runtime alike and
the per-round ratios cancel it; the table prints the median of per-round ratios with its 95 %
order-statistic interval. Calls alternate, never overlap (two OpenMP pools at once would fight).
The bound: a call must read at least its weights (plus its K/V cache) once, so ``bytes / read
bandwidth`` is the fastest it can possibly be on this machine; the bandwidth is measured right
before each stage's rounds, at the stage's thread count, with several reductions over an array
far larger than any cache, because it swings minute to minute on a shared host. Every table is
headed by the machine (CPU model, ISA features, threads, that bandwidth).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ncnnport.runtime.perf_timing import RatioEstimate, interleaved_ms, ratio_estimate, rounds_first

Call = Callable[[], Any]
WARMUP = 3


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


# The largest buffer a bound's reads sweep (probe_bytes): past the last-level cache the read
# speed no longer depends on the size.
PROBE_MAX_BYTES = 1 << 30


def probe_bytes(nbytes: int) -> int:
    """The buffer a bound's reads sweep for a call (a decoded token in bench-cpp, a stage in
    bench-perf) that reads ``nbytes`` of weights: the same bytes, whole MiB, at most
    ``PROBE_MAX_BYTES``. Why the call's own size: the last-level cache can hold a
    fixed 256 MiB buffer (this project's 2-core Xeon reports a 480 MiB L3: one thread read 64 MiB at
    29 GB/s, 256 MiB at 21, 417 MiB at 19.7, 834 MiB-2 GiB at 17.5-17.8), so a fixed buffer measured
    another mix of cache and DRAM than the token's own weights meet, and the bound moved with the
    precision for no reason of the port's: too high for a token larger than the buffer (fp32, fp16),
    too low for a smaller one (int8). Swept cyclically, a buffer of the token's size meets the cache
    as the call's weights do, call after call. Capped: past the cache the speed no longer
    depends on the size (1 and 2 GiB read alike), and the reductions hold three such arrays."""
    return max(1 << 20, min(int(nbytes), PROBE_MAX_BYTES) >> 20 << 20)


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
        seconds = statistics.median(interleaved_ms([kernel], runs, warmup=1)[0]) / 1e3
        bytes_read = 2 * n_bytes if name == "numpy_dot" else n_bytes
        out[f"{name}_gbps"] = bytes_read / seconds / 1e9
    del ones
    b = np.empty_like(a)
    seconds = statistics.median(interleaved_ms([lambda: np.copyto(b, a)], runs, warmup=1)[0]) / 1e3
    out["copy_gbps"] = 2 * n_bytes / seconds / 1e9
    out["read_gbps"] = max(v for k, v in out.items() if k.endswith("_gbps") and k != "copy_gbps")
    return out


def huge_pages_malloc() -> bool:
    """Whether glibc's malloc was told to back large allocations with transparent huge pages
    (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, read once at process start). It changes both the
    runtimes and the bandwidth measured here, so every speed table says which it was."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(t.strip() in ("glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=2") for t in tunables.split(":"))


def bound_row(ncnn_ms: float, nbytes: dict[str, int] | None, bandwidth_gbps: float,
              fp32_runtimes: dict[str, float | None] | None = None,
              fp32_nbytes: dict[str, int] | None = None,
              fp32_bandwidth_gbps: float | None = None) -> dict[str, Any]:
    """Bound columns for one timed stage: bytes per call, the bound in ms (weights only and
    weights + K/V cache) and each runtime's percentage of it (100% = at the bandwidth limit).

    ``nbytes`` is what ncnn reads under its precision; the fp32 runtimes (torch, ONNX Runtime:
    ``{"torch": ms, "ort": ms}``) are judged against the bound of the fp32 bytes they read
    (``fp32_nbytes``, default ``nbytes``), so a reduced-precision run does not report torch at a
    fraction of a bound it never had to meet, at ``fp32_bandwidth_gbps`` where given (a read
    over a buffer of their size; default ``bandwidth_gbps``)."""
    if not nbytes:
        return {}
    weights = int(nbytes.get("weights", 0))
    total = weights + int(nbytes.get("kv_cache", 0))
    bound_w = weights / (bandwidth_gbps * 1e9) * 1e3
    bound_all = total / (bandwidth_gbps * 1e9) * 1e3
    fp32_w = int((fp32_nbytes or nbytes).get("weights", 0)) / ((fp32_bandwidth_gbps or bandwidth_gbps) * 1e9) * 1e3
    row = {"weight_bytes": weights, "kv_bytes": total - weights, "bound_weights_ms": bound_w,
           "bound_ms": bound_all, "fp32_bound_weights_ms": fp32_w, "ncnn_pct_of_bound": 100 * bound_w / ncnn_ms,
           "ncnn_pct_of_bound_with_kv": 100 * bound_all / ncnn_ms}
    for name, ms in (fp32_runtimes or {}).items():
        if ms:
            row[f"{name}_pct_of_bound"] = 100 * fp32_w / ms
    return row




def _hook(port: Any, name: str, *args: Any) -> Any:
    """A bench hook the port may lack (duck-typed test ports): None when absent."""
    fn = getattr(port, name, None)
    return None if fn is None else fn(*args)


def _peer(prep: Any, stage: str, size: str, threads: int, workdir: Path | None) -> tuple[Call | None, str]:
    """The ONNX Runtime call of the stage, or None and the reason (no peer asked: empty reason)."""
    if workdir is None:
        return None, ""
    from ncnnport.drivers.onnx_peer import peer_call

    graphs = _hook(prep.port, "bench_peer_graphs", prep.loaded, stage, size)
    return peer_call({s.name: s for s in getattr(prep, "specs", [])}, graphs, threads, workdir)


@dataclass
class SizeCalls:
    """One size of a stage, ready to time: torch's, ncnn's and the peer's call (None: no peer)."""

    size: str
    torch: Call
    ncnn: Call
    peer: Call | None = None


def time_sizes(sizes: Sequence[SizeCalls], runs: int, warmup: int = WARMUP) -> list[dict[str, Any]]:
    """Every size's torch, ncnn and peer calls interleaved call by call in ONE loop: medians,
    per-round ratios vs ncnn, and, per other size of the stage, each runtime's per-round ratio of
    its time here over its time there (``over_size``: the flatness in context, P=1000 over P=100,
    a ratio of two sizes as honest as the runtimes' ratios only if the sizes share the rounds;
    timed one size after the other, a load arriving between the blocks moves it). Each such ratio
    keeps ``first``: the rounds in which this size's call ran before the other's."""
    calls: list[Call] = []
    where: list[dict[str, int]] = []
    for s in sizes:
        index = {"torch": len(calls), "ncnn": len(calls) + 1}
        calls += [s.torch, s.ncnn]
        if s.peer is not None:
            index["ort"] = len(calls)
            calls.append(s.peer)
        where.append(index)
    times = interleaved_ms(calls, runs, warmup)
    out = []
    for s, index in zip(sizes, where):
        mine = {name: times[i] for name, i in index.items()}
        row: dict[str, Any] = {"torch_ms": statistics.median(mine["torch"]), "ncnn_ms": statistics.median(mine["ncnn"]),
                               "ratio_est": ratio_estimate(mine["torch"], mine["ncnn"]), "rounds": runs}
        if "ort" in mine:
            row["ort_ms"] = statistics.median(mine["ort"])
            row["ort_ratio_est"] = ratio_estimate(mine["ort"], mine["ncnn"])
        over = {other.size: {f"{name}_ms": {**ratio_estimate(series, times[there[name]]).to_json(),
                                            "first": rounds_first(len(calls), runs, index[name], there[name])}
                             for name, series in mine.items() if name in there}
                for other, there in zip(sizes, where) if other is not s}
        if over:
            row["over_size"] = over
        out.append(row)
    return out


def _ci(est: RatioEstimate | None) -> str:
    return "-" if est is None else est.text()


def _pct(row: dict[str, Any], key: str) -> str:
    return "-" if row.get(key) is None else f"{row[key]:.0f}%"


TABLE_HEADER = ("| model | stage | size | threads | torch eager (ms) | ncnn (ms) | torch/ncnn [95% CI] "
                "| ORT CPU fp32 (ms) | ORT/ncnn [95% CI] | read GB/s | weight MB | bound (ms) | ncnn % of bound "
                "| torch % of fp32 bound | ORT % of fp32 bound | ncnn % incl. K/V | note |")


def format_row(model: str, r: dict[str, Any]) -> str:
    """One printed row of the speed table (``-`` where a column has no value)."""
    bound = (f"{r['weight_bytes'] / 2**20:.0f} | {r['bound_weights_ms']:.2f}" if "weight_bytes" in r else "- | -")
    ort_ms = "-" if r.get("ort_ms") is None else f"{r['ort_ms']:.3f}"
    return (f"| {model} | {r['stage']} | {r['size']} | {r['threads']} | {r['torch_ms']:.3f} | {r['ncnn_ms']:.3f} | "
            f"{_ci(r.get('ratio_est'))} | {ort_ms} | {_ci(r.get('ort_ratio_est'))} | "
            f"{_read_cell(r)} | {bound} | {_pct(r, 'ncnn_pct_of_bound')} | "
            f"{_pct(r, 'torch_pct_of_bound')} | {_pct(r, 'ort_pct_of_bound')} | "
            f"{_pct(r, 'ncnn_pct_of_bound_with_kv')} | {r.get('ort_note', '')} |")


def _read_cell(r: dict[str, Any]) -> str:
    """The row's read GB/s, with the fp32 runtimes' own read where their bytes swept another buffer."""
    cell = f"{r['bandwidth']['read_gbps']:.1f}"
    return cell + (f" (fp32 {r['fp32_bandwidth']['read_gbps']:.1f})" if "fp32_bandwidth" in r else "")


def _json_row(r: dict[str, Any]) -> dict[str, Any]:
    """The row as JSON: ratio estimates as their numbers."""
    out = {k: v for k, v in r.items() if not k.endswith("_est")}
    for key in ("ratio_est", "ort_ratio_est"):
        if r.get(key) is not None:
            out[key[:-4] + "_ci"] = r[key].to_json()
    return out


def torch_ratio_table(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None,
                      threads: int, runs: int, stage_sizes: dict[str, list[str]] | None = None,
                      precision: str = "fp32", reference_package: Path | None = None,
                      peer_dir: Path | None = None) -> list[dict[str, Any]]:
    """One row per (stage, size): torch, ncnn (and, with ``peer_dir``, ONNX Runtime) timed
    interleaved, medians, per-round ratios vs ncnn with their interval and, where the port knows
    the bytes a call reads, the bandwidth bound columns (this stage's ``read_gbps`` in every row).
    ncnn runs under ``precision`` (judged once against the fp32 graphs of ``reference_package``);
    torch and the peer are always fp32, so the ratio says what the precision buys over the
    reference. torch's thread count is the bench's for the table only."""
    with torch_threads(threads):
        rows = _table(prep, package, stages, sizes, threads, runs, stage_sizes, precision,
                      reference_package or package, peer_dir)
    return [_json_row(r) for r in rows]


def _heading(threads: int, precision: str) -> None:
    from ncnnport.runtime.machine import cpu_record, table_heading

    bw = read_bandwidth()
    kernels = ", ".join(f"{k[:-5]} {v:.1f}" for k, v in bw.items() if k.endswith("_gbps") and k != "read_gbps")
    extra = (f"fastest of {kernels} GB/s over {bw['array_mb']:.0f} MB here; each stage's bound re-measured before "
             f"it over a buffer of its own weight bytes (at most {PROBE_MAX_BYTES >> 20} MiB); "
             f"malloc huge pages {'on' if huge_pages_malloc() else 'off'}; "
             f"OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')}; ncnn --precision {precision}")
    print("\n" + table_heading(cpu_record(), threads, bw["read_gbps"], extra))


def _table(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None, threads: int,
           runs: int, stage_sizes: dict[str, list[str]] | None, precision: str,
           reference_package: Path, peer_dir: Path | None) -> list[dict[str, Any]]:
    from ncnnport.drivers.bench import backend_options, check_fidelity
    from ncnnport.memory import release_memory
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    known = stage_sizes or prep.port.bench_stages()
    model = prep.target.model
    _heading(threads, precision)
    rows = []
    print("\n" + TABLE_HEADER)
    print("|" + "---|" * TABLE_HEADER.count(" | ") + "---|")
    for stage in stages:
        # the stage's sizes share one ncnn session (a decode graph meets every context length in
        # one run) and one interleaved loop (time_sizes: so P=1000 over P=100 is a per-round ratio)
        modules = open_ncnn_modules(package, options=backend_options("cpu", threads, precision))
        ncnn_calls: dict[str, Call] = {}
        checked: dict[str, bool | None] = {}
        for size in (sizes or known[stage]):
            # every size's fidelity first, before torch and the peers hold their memory: the fp32
            # graphs it opens are transient, and at real widths they came on top of everything
            # else (Youtu-VL layers, fp16: a 24 GB machine ran out with both sizes' calls alive)
            ncnn_calls[size] = prep.port.bench_call(prep.loaded, modules, stage, size)
            checked[size] = check_fidelity(prep, reference_package, stage, size, ncnn_calls[size](), precision,
                                           threads)
            release_memory()
        ready: list[SizeCalls] = []
        rows_of_stage: list[dict[str, Any]] = []
        counted: list[tuple[Any, Any]] = []  # each size's bytes under the precision and in fp32
        for size, ncall in ncnn_calls.items():
            tcall = prep.port.torch_bench_call(prep.loaded, stage, size)
            if tcall is None:
                continue
            pcall, note = _peer(prep, stage, size, threads, peer_dir)
            nbytes = prep.port.bench_bytes(prep.loaded, stage, size, precision)
            fp32 = nbytes if precision == "fp32" else prep.port.bench_bytes(prep.loaded, stage, size, "fp32")
            bw, fp32_bw = stage_bandwidths(nbytes, fp32)
            ready.append(SizeCalls(size, tcall, ncall, pcall))
            within = checked[size]
            row = {"stage": stage, "size": size, "threads": threads, "precision": precision, "bandwidth": bw,
                   "huge_pages_malloc": huge_pages_malloc(),
                   **({} if within is None else {"within_budget": within}), **({"ort_note": note} if note else {})}
            if fp32_bw is not bw:
                row["fp32_bandwidth"] = fp32_bw
            rows_of_stage.append(row)
            counted.append((nbytes, fp32))
        timed_sizes = time_sizes(ready, runs) if ready else []
        del ready, ncnn_calls, modules
        release_memory()
        for row, timed, (nbytes, fp32) in zip(rows_of_stage, timed_sizes, counted):
            row.update(timed)
            row["ratio"] = timed["ratio_est"].median
            if "ort_ratio_est" in timed:
                row["ort_ratio"] = timed["ort_ratio_est"].median
            fp32_bw = row.get("fp32_bandwidth", row["bandwidth"])
            row.update(bound_row(timed["ncnn_ms"], nbytes, row["bandwidth"]["read_gbps"],
                                 {"torch": timed["torch_ms"], "ort": timed.get("ort_ms")}, fp32, fp32_bw["read_gbps"]))
            rows.append(row)
            print(format_row(model, row), flush=True)
    return rows


def stage_bandwidths(nbytes: dict[str, int] | None,
                     fp32_nbytes: dict[str, int] | None) -> tuple[dict[str, float], dict[str, float]]:
    """The read bandwidth for a stage's bound, over a buffer of its weight bytes (``probe_bytes``;
    the default 256 MiB where the port counts none), and the one for the fp32 runtimes' bound over
    their fp32 bytes: the same dict where both sizes round alike."""
    def swept(counted: dict[str, int] | None) -> int | None:
        weights = int((counted or {}).get("weights", 0))
        return probe_bytes(weights) if weights else None

    size, fp32_size = swept(nbytes), swept(fp32_nbytes or nbytes)
    bw = read_bandwidth(size) if size else read_bandwidth()
    return bw, (bw if fp32_size == size else read_bandwidth(fp32_size) if fp32_size else bw)


def scaling(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stage, size and runtime: the median at each thread count and the scaling efficiency
    ``(ms at t0 * t0) / (ms at t * t)`` against the smallest count t0 (1.0 = linear)."""
    out = []
    for stage, size in dict.fromkeys((r["stage"], r["size"]) for r in rows):
        mine = sorted((r for r in rows if r["stage"] == stage and r["size"] == size), key=lambda r: r["threads"])
        for runtime in ("torch", "ncnn", "ort"):
            timed = [(r["threads"], r[f"{runtime}_ms"]) for r in mine if r.get(f"{runtime}_ms")]
            if len(timed) < 2:
                continue
            t0, ms0 = timed[0]
            out.append({"stage": stage, "size": size, "runtime": runtime,
                        "ms": {str(t): ms for t, ms in timed},
                        "efficiency": {str(t): ms0 * t0 / (ms * t) for t, ms in timed}})
    return out


def print_scaling(model: str, table: Sequence[dict[str, Any]]) -> None:
    if not table:
        return
    print(f"\nthread scaling ({model}; efficiency = ms(t0) x t0 / (ms(t) x t), 1.00 = linear):")
    print("| stage | size | runtime | median ms per thread count | efficiency |")
    print("|---|---|---|---|---|")
    for s in table:
        ms = ", ".join(f"t{t} {v:.3f}" for t, v in s["ms"].items())
        eff = ", ".join(f"t{t} {v:.2f}" for t, v in s["efficiency"].items())
        print(f"| {s['stage']} | {s['size']} | {s['runtime']} | {ms} | {eff} |")


def perf_report(prep: Any, package: Path, stages: Sequence[str], sizes: Sequence[str] | None,
                threads_list: Sequence[int], runs: int, stage_sizes: dict[str, list[str]] | None = None,
                precision: str = "fp32", reference_package: Path | None = None,
                peer: bool = True) -> dict[str, Any]:
    """``bench --perf``: the speed table at every thread count of ``threads_list``, the thread
    scaling, and the model's declared targets judged on these rows."""
    from ncnnport.runtime.perf_targets import judge, print_verdicts
    from ncnnport.runtime import precision as precisions
    from ncnnport.runtime.machine import cpu_record

    reference_package = reference_package or package
    peer_dir = reference_package.parent / "onnx-peer" if peer else None
    rows: list[dict[str, Any]] = []
    for n in threads_list:
        rows += torch_ratio_table(prep, package, stages, sizes, n, runs, stage_sizes, precision,
                                  reference_package, peer_dir)
    model = prep.target.model
    table = scaling(rows)
    print_scaling(model, table)
    targets = _hook(prep.port, "bench_perf_targets") or []
    verdicts = judge(targets, rows, precisions.get(precision).inner_product_weight_bytes)
    print_verdicts(model, verdicts)
    return {"machine": cpu_record(), "rows": rows, "scaling": table, "targets": verdicts}
