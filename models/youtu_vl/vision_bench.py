"""Youtu-VL vision encoder speed at large images, measured one layer at a time.

Why per layer: at 1024x1024 (4096 patches) one encoder call is 27 real-width layers, and on
this project's 2-core machine each layer took 5-30 s per runtime (docs/performance.md), so the
whole-encoder bench (3 warm-up + 20 interleaved rounds, torch and ncnn) needed hours, not 15
minutes; at the 36864-patch cap the torch reference's full-attention layers alone would hold
a ``[16, N, N]`` float32 score matrix (87 GB). Nothing in the ncnn graphs grew worse than the
work: window layers scale with the number of windows, full-attention layers with N^2.

So this bench converts ONE window block and ONE full-attention block at the real widths
(hidden 1152, 16 heads, MLP 4304) with seeded weights, runs each exactly as the pipeline does
(window layers once per window of the image's real window layout, full layers once over all
patches), interleaved with the reference's own blocks in torch, and builds the encoder time as
``windowed layers x window-layer time + full layers x full-layer time``; left out are the patch
embedding (a 768->1152 Linear), post-LN and the merger (two Linears on N/4 rows, ~0.55 of one
layer's FLOPs). Sizes whose layers are too slow
to time here are extrapolated from the largest timed size and labelled ``extrapolated``: a window
layer scales with the patch count (its windows are all full at 1024 and at the cap), and a full
layer is that window layer plus the attention pairs it adds, ``b (N^2 - sum of window^2)``, with
``b`` read off the timed size (full minus window layer at the same N: the Gemms are identical;
for ncnn the window layer run one window at a time on all threads, as the full layer runs, not
its side-by-side time).
A fit through two sizes was tried and dropped: at 784 patches the N^2 term is a few percent of
the time, so load noise there swung the fitted cap estimate by 16x between two runs.

``--precision`` runs the ncnn blocks under a ``runtime/precision.py`` name (torch stays fp32
eager), as ``run --precision`` runs the package's vision segments (``int8-weights``: the blocks'
Gemms rewritten to int8 as ``package-int8w`` holds them). A speed-up bought with
precision only counts where the port still computes the model: every timed size also compares
each ncnn layer with the torch block on the same inputs and judges it by the model policy's gate
of that precision's mode (the gate ``parity`` applies to the vision segments), and the >= 1.5x
verdict is ``met`` only when that gate passes too.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.metrics import compare, judge
from ncnnport.models.youtu_vl.config import VisionConfig
from ncnnport.models.youtu_vl.processor import patch_positions, target_size, window_layout
from ncnnport.models.youtu_vl.pipeline import WINDOW_CONCURRENT_CALLS
from ncnnport.parity.policy import Policy
from ncnnport.runtime import precision as precisions
from ncnnport.runtime.concurrent_calls import run_each
from ncnnport.runtime.rope2d import axial_cos_sin, axial_inv_freq

TARGET_RATIO = 1.5  # issue 17: the vision encoder >= 1.5x torch at each size
CAP_PATCHES = 36864
POLICY = Path(__file__).with_name("policy.json")


def bench_precision(name: str) -> precisions.Precision:
    """The precision the ncnn blocks run: a name of runtime/precision.py that is ncnn option
    flags, or ``int8-weights``, whose blocks this bench rewrites as ``package-int8w`` rewrites
    the vision segments (:func:`int8_block`). fp16 weights come from pnnx at conversion, which
    this bench does not redo: one-line ValueError."""
    p = precisions.get(name)
    if p.fp16_weights:
        usable = ", ".join(n for n, q in precisions.PRECISIONS.items() if not q.fp16_weights)
        raise ValueError(f"--precision {name!r} is a derived package ({p.package_name}); "
                         f"the vision bench runs: {usable}")
    return p


def int8_block(param: Path) -> Path:
    """``param``'s graph with its weight Gemms in int8 (``convert.int8_weights.rewrite_graph``
    with ``gemms``, what ``int8_package`` does to a vision segment, whose spec sets
    ``int8_rows``) beside it, as ``<name>.int8w.ncnn.param``; redone when missing or older than
    the fp32 weights or the rewrite's code."""
    from ncnnport.convert import int8_weights
    from ncnnport.convert.int8_weights import rewrite_graph

    weights = param.with_name(param.name.replace(".param", ".bin"))
    out = param.with_name(param.name.replace(".ncnn.param", ".int8w.ncnn.param"))
    out_bin = out.with_name(out.name.replace(".param", ".bin"))
    newest_input = max(weights.stat().st_mtime, Path(int8_weights.__file__).stat().st_mtime)
    if not (out.is_file() and out_bin.is_file() and out_bin.stat().st_mtime >= newest_input):
        if not rewrite_graph(param, weights, out, out_bin, {}, gemms=True):
            raise RuntimeError(f"{param}: no weight Gemm to run in int8")
    return out


def layer_gate(p: precisions.Precision, policy_path: Path = POLICY) -> Tolerance:
    """The gate a vision segment is judged by under ``p`` on the CPU (the policy has no per-module
    entry for vision segments, so it is the mode's default: fp32's, or the roundoff rule's)."""
    return Policy.load(policy_path).default(precisions.judging_mode(p, use_vulkan=False))


@dataclass(frozen=True)
class LayerCase:
    """One image size: its patch grid and the windows the pipeline runs a window layer on."""

    label: str
    grid_hw: tuple[int, int]
    windows: tuple[tuple[int, int], ...]

    @property
    def patches(self) -> int:
        return self.grid_hw[0] * self.grid_hw[1]


def case_for(size: str, cfg: VisionConfig) -> LayerCase:
    """``"HxW"`` pixels, or ``"cap"`` (the 36864-patch square), through the official resize rule."""
    if size == "cap":
        side = int(CAP_PATCHES ** 0.5) * cfg.patch_size
        h, w = side, side
    else:
        try:
            h, w = (int(v) for v in size.lower().split("x"))
        except ValueError:
            raise ValueError(f"vision bench size {size!r}: use HxW pixels (e.g. 1024x1024) or 'cap'") from None
    rh, rw = target_size(h, w, patch=cfg.patch_size, merge=cfg.spatial_merge_size, max_num_patches=CAP_PATCHES)
    grid = (rh // cfg.patch_size, rw // cfg.patch_size)
    _, cu = window_layout(*grid, cfg.spatial_merge_size, cfg.window_tokens)
    bounds = [int(c) for c in cu]
    return LayerCase(size, grid, tuple(zip(bounds[:-1], bounds[1:])))


def two_block_config(cfg: VisionConfig) -> VisionConfig:
    """The real widths with two blocks: block 0 windowed, block 1 full attention."""
    return dataclasses.replace(cfg, num_hidden_layers=2, fullatt_block_indexes=(1,))


def layer_counts(cfg: VisionConfig) -> tuple[int, int]:
    """(windowed blocks, full-attention blocks) of the encoder the estimate stands for."""
    full = len(set(cfg.fullatt_block_indexes))
    return cfg.num_hidden_layers - full, full


def encoder_ms(window_ms: float, full_ms: float, cfg: VisionConfig) -> float:
    """Encoder time from one layer of each kind (blocks only; see the module docstring)."""
    n_win, n_full = layer_counts(cfg)
    return n_win * window_ms + n_full * full_ms


def attention_pairs(case: LayerCase) -> tuple[int, int]:
    """(query-key pairs of a full-attention layer, of a window layer) over the case's patches."""
    return case.patches ** 2, sum((b - a) ** 2 for a, b in case.windows)


def rope_inputs(case: LayerCase, cfg: VisionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """``[1,N,D]`` hidden states and the case's real RoPE tables (window order does not change cost)."""
    cos, sin = axial_cos_sin(patch_positions(*case.grid_hw, cfg.spatial_merge_size),
                             axial_inv_freq(cfg.head_dim, cfg.rope_theta))
    x = rng.standard_normal((1, case.patches, cfg.hidden_size)).astype(np.float32)
    return [x, np.ascontiguousarray(cos[None], np.float32), np.ascontiguousarray(sin[None], np.float32)]


def ncnn_layer_call(runner: Any, inputs: list[np.ndarray], spans: Sequence[tuple[int, int]]) -> Callable[[], np.ndarray]:
    """One layer as ``run_vision_segments`` runs it: the graph once per span (side by side as
    the runner's ``concurrent_calls`` allows), outputs concatenated."""
    x, cos, sin = inputs
    parts = [[np.ascontiguousarray(t[:, a:b]) for t in (x, cos, sin)] for a, b in spans]

    def call() -> np.ndarray:
        return np.concatenate([out[0] for out in run_each(runner, parts)], axis=1)
    return call


def torch_layer_call(block: Any, inputs: list[np.ndarray], spans: Sequence[tuple[int, int]]) -> Callable[[], Any]:
    """The reference block (``vision.VisionBlock``: explicit per-window attention) on the same rows."""
    import torch

    x, cos, sin = (torch.from_numpy(t[0]) for t in inputs)
    cu = [spans[0][0], *(b for _, b in spans)]

    def call() -> Any:
        with torch.no_grad():
            return block(x, cos, sin, cu)
    return call


def build_graphs(cfg: VisionConfig, out: Path, seed: int = 0) -> tuple[Any, dict[str, Path]]:
    """Seeded two-block tower (torch) and its two one-block segment graphs converted with pnnx
    exactly as ``specs._segment_spec`` declares them (TorchScript traced at 192 and 64 patches)."""
    import torch

    from ncnnport.convert.pnnx_runner import convert_module
    from ncnnport.models.youtu_vl.vision import Siglip2
    from ncnnport.models.youtu_vl.wrappers import VisionSegmentGraph

    small = two_block_config(cfg)
    torch.manual_seed(seed)
    tower = Siglip2(small).eval()
    with torch.no_grad():
        for p in tower.parameters():
            p.normal_(0.0, 0.02)

    class _Parts:  # what VisionSegmentGraph reads: .cfg.vision and .part(name)
        def __init__(self) -> None:
            self.cfg = argparse.Namespace(vision=small)

        def part(self, name: str) -> Any:
            return tower.get_submodule(name.split(".", 1)[1])

    out.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for kind, index in (("window", 0), ("full", 1)):
        name = f"vision_block_{kind}"
        graphs[kind] = out / f"{name}.ncnn.param"
        if graphs[kind].is_file():
            continue
        wrapper = VisionSegmentGraph(_Parts(), index, index + 1, first=False, last=False).eval()
        example = tuple(torch.randn(1, 192, d) for d in (small.hidden_size, small.head_dim, small.head_dim))
        torch.jit.trace(wrapper, example).save(str(out / f"{name}.pt"))
        convert_module(segment_spec(name, small), out / f"{name}.pt", out)
    return tower, graphs


def segment_spec(name: str, cfg: VisionConfig, concurrent_calls: int = 1) -> dict[str, Any]:
    """The spec JSON of a middle vision segment (no embedding, no post-LN)."""
    t = lambda n, d: {"name": n, "shape": [1, "patches", d], "dtype": "float32"}  # noqa: E731
    return {"name": name, "inputs": [t("x", cfg.hidden_size), t("cos", cfg.head_dim), t("sin", cfg.head_dim)],
            "outputs": [t("hidden_out", cfg.hidden_size)], "axes": {"patches": [192, 64]},
            "concurrent_calls": concurrent_calls}


def open_graph(param: Path, cfg: VisionConfig, threads: int, precision: str = "fp32",
               concurrent_calls: int = 1) -> Any:
    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.runtime.session import NcnnModule

    p = bench_precision(precision)
    options = p.options(RuntimeOptions(num_threads=threads))
    name = param.name.split(".")[0]
    if p.int8_weights:
        param = int8_block(param)
    return NcnnModule(param, param.with_name(param.name.replace(".param", ".bin")),
                      segment_spec(name, cfg, concurrent_calls), options)


def open_runners(graphs: dict[str, Path], cfg: VisionConfig, threads: int, precision: str = "fp32",
                 window_calls: int = WINDOW_CONCURRENT_CALLS) -> dict[str, Any]:
    """The window block as the pipeline's window segments run (``concurrent_calls`` =
    ``window_calls``, the package's ``WINDOW_CONCURRENT_CALLS`` unless trying another), the
    full-attention block, and the window block once more opened for one window after another on
    all threads (``window_serial``: what running the windows side by side gains, timed in the
    same rounds)."""
    return {"window": open_graph(graphs["window"], cfg, threads, precision, window_calls),
            "full": open_graph(graphs["full"], cfg, threads, precision),
            "window_serial": open_graph(graphs["window"], cfg, threads, precision)}


def layer_parity(reference: np.ndarray, candidate: np.ndarray, gate: Tolerance) -> dict[str, Any]:
    """One layer's ncnn output against the torch block's on the same inputs, judged by ``gate``."""
    stats = compare(reference, candidate, what="vision layer")
    passed, reason = judge(stats, gate)
    return {"max_abs_rel": stats.max_abs / stats.ref_absmax if stats.ref_absmax else stats.max_abs,
            "worst_row_cosine": stats.worst_row_cosine, "passed": passed, "reason": reason}


def peak_rss_mb() -> float:
    """This process's peak resident set so far (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_case(case: LayerCase, tower: Any, runners: dict[str, Any], cfg: VisionConfig,
                 rounds: int, gate: Tolerance | None = None) -> dict[str, Any]:
    """Median ms per layer kind and runtime over ``rounds`` interleaved rounds (1 warm-up), the
    per-round torch/ncnn ratios' median, the window layer's windows run one after another too
    (``serial_ms``, timed in the same rounds: what running them side by side gains), each layer's parity against the torch block (judged by
    ``gate``, from the warm-up calls; fp32's by default), and the process's peak RSS after the
    ncnn calls and after the torch calls (the torch side allocates its own activations and score
    matrices)."""
    from ncnnport.runtime.perf_timing import interleaved_ms

    gate = gate or layer_gate(bench_precision("fp32"))
    inputs = rope_inputs(case, cfg, np.random.default_rng(0))
    whole = ((0, case.patches),)
    blocks = tower.vision_model.encoder.layers
    nc = [ncnn_layer_call(runners["window"], inputs, case.windows), ncnn_layer_call(runners["full"], inputs, whole)]
    got = [call() for call in nc]
    rss_ncnn = peak_rss_mb()
    th = [torch_layer_call(blocks[0], inputs, case.windows), torch_layer_call(blocks[1], inputs, whole)]
    parity = {kind: layer_parity(call().numpy(), out[0], gate) for kind, call, out in zip(("window", "full"), th, got)}
    del got
    serial = ncnn_layer_call(runners["window_serial"], inputs, case.windows)
    times = interleaved_ms([nc[0], th[0], nc[1], th[1], serial], rounds, warmup=0)
    *times, serial_times = times
    med = [statistics.median(t) for t in times]
    ratio = lambda a, b: statistics.median(y / x for x, y in zip(times[a], times[b]))  # noqa: E731
    return {"size": case.label, "patches": case.patches, "windows": len(case.windows), "rounds": rounds,
            "window_ms": {"ncnn": med[0], "torch": med[1], "ratio": ratio(0, 1)},
            "serial_ms": {"ncnn": statistics.median(serial_times),
                          "gain": statistics.median(s / c for c, s in zip(times[0], serial_times))},
            "full_ms": {"ncnn": med[2], "torch": med[3], "ratio": ratio(2, 3)},
            "encoder_ratio": encoder_round_ratio(times, cfg), "round_ms": times, "parity": parity,
            "peak_rss_mb": {"after_ncnn": rss_ncnn, "after_torch": peak_rss_mb()}, "extrapolated": False}


def encoder_round_ratio(times: Sequence[Sequence[float]], cfg: VisionConfig) -> float:
    """Median over rounds of torch/ncnn encoder time, each round's encoder built from that
    round's four layer calls (ncnn window, torch window, ncnn full, torch full): the ratio of
    calls timed side by side, as every speed table here reports it, not of medians taken apart."""
    per_round = [encoder_ms(tw, tf, cfg) / encoder_ms(nw, nf, cfg) for nw, tw, nf, tf in zip(*times)]
    return statistics.median(per_round)


def extrapolate(case: LayerCase, timed: LayerCase, row: dict[str, Any]) -> dict[str, Any]:
    """``case`` estimated from the measured ``row`` of ``timed`` (see the module docstring)."""
    scale = case.patches / timed.patches
    full_pairs, win_pairs = attention_pairs(case)
    timed_full, timed_win = attention_pairs(timed)
    out: dict[str, Any] = {"size": case.label, "patches": case.patches, "windows": len(case.windows),
                           "rounds": 0, "extrapolated": True, "peak_rss_mb": None,
                           "window_ms": {}, "full_ms": {}, "parity": row.get("parity"), "parity_from": timed.label}
    for runtime in ("ncnn", "torch"):
        win = row["window_ms"][runtime]
        # a full layer is the window layer run as the full layer runs (one call on all threads)
        # plus the attention pairs it adds: ncnn's window layer runs its windows side by side,
        # so its one-at-a-time time on all threads (serial_ms) is that base; the side-by-side
        # time made the pairs look dearer by the whole concurrency gain (16 threads, 448: 20
        # against 30 ms) and the base cheaper by it
        alike = row.get("serial_ms", {}).get("ncnn", win) if runtime == "ncnn" else win
        per_pair = (row["full_ms"][runtime] - alike) / (timed_full - timed_win)
        out["window_ms"][runtime] = win * scale
        out["full_ms"][runtime] = alike * scale + per_pair * (full_pairs - win_pairs)
    for kind in ("window_ms", "full_ms"):
        out[kind]["ratio"] = out[kind]["torch"] / out[kind]["ncnn"]
    return out


def encoder_row(row: dict[str, Any], cfg: VisionConfig) -> dict[str, float]:
    """Full-depth encoder ms per runtime (from the layer medians) and the torch/ncnn ratio: the
    per-round median where the row was timed, the ratio of the estimates where extrapolated."""
    ms = {r: encoder_ms(row["window_ms"][r], row["full_ms"][r], cfg) for r in ("ncnn", "torch")}
    return {**ms, "ratio": row.get("encoder_ratio") or ms["torch"] / ms["ncnn"]}


def verdict(row: dict[str, Any], cfg: VisionConfig) -> str:
    """``met`` when the encoder is >= TARGET_RATIO x torch and every layer passed its parity gate
    (a row without parity, e.g. a hand-made one, is judged on speed alone)."""
    if encoder_row(row, cfg)["ratio"] < TARGET_RATIO:
        return "not met"
    failed = [kind for kind, p in (row.get("parity") or {}).items() if not p["passed"]]
    return f"not met (parity: {', '.join(failed)} layer outside the gate)" if failed else "met"


def _parity_text(row: dict[str, Any]) -> str:
    parity = row.get("parity")
    if not parity:
        return "-"
    cells = " / ".join(f"{parity[k]['max_abs_rel']:.1e}{'' if parity[k]['passed'] else ' FAIL'}" for k in ("window", "full"))
    return cells + (f" (as {row['parity_from']})" if row.get("parity_from") else "")


def table(rows: Sequence[dict[str, Any]], cfg: VisionConfig, threads: int, precision: str = "fp32",
          gate: Tolerance | None = None) -> list[str]:
    """Markdown rows: per-layer medians, the encoder estimate, each layer's parity and the
    >= 1.5x verdict."""
    n_win, n_full = layer_counts(cfg)
    gate_text = f" (gate {gate.max_abs_rel:.2g}, cos >= {gate.min_cosine:.6g})" if gate else ""
    out = [f"| threads | ncnn precision | size | patches | windows | window layer ncnn / torch ms (x) "
           f"| full layer ncnn / torch ms (x) | encoder ({n_win} win + {n_full} full) ncnn / torch s "
           f"| ratio (per round) | max_abs/max\\|ref\\| window / full{gate_text} | >= {TARGET_RATIO}x "
           f"| peak RSS MB (ncnn / +torch) | window layer, windows one by one: ncnn ms (side by side x) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        enc = encoder_row(r, cfg)
        w, f = r["window_ms"], r["full_ms"]
        rss = r["peak_rss_mb"]
        out.append(f"| {threads} | {precision} | {r['size']}{' (extrapolated)' if r['extrapolated'] else ''} "
                   f"| {r['patches']} | {r['windows']} | {w['ncnn']:.0f} / {w['torch']:.0f} ({w['ratio']:.2f}) "
                   f"| {f['ncnn']:.0f} / {f['torch']:.0f} ({f['ratio']:.2f}) "
                   f"| {enc['ncnn'] / 1e3:.1f} / {enc['torch'] / 1e3:.1f} | {enc['ratio']:.2f} "
                   f"| {_parity_text(r)} | {verdict(r, cfg)} | {_rss_text(rss)} | {_serial_text(r)} |")
    return out


def _serial_text(row: dict[str, Any]) -> str:
    serial = row.get("serial_ms")
    return "-" if not serial else f"{serial['ncnn']:.0f} ({serial['gain']:.2f})"


def _rss_text(rss: dict[str, float] | None) -> str:
    return "-" if rss is None else f"{rss['after_ncnn']:.0f} / {rss['after_torch']:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ncnnport.models.youtu_vl.vision_bench",
                                description="Youtu-VL vision layers at real width, ncnn vs torch, interleaved")
    p.add_argument("--sizes", default="448x448,1024x1024", help="timed sizes, HxW pixels")
    p.add_argument("--extrapolate", default="cap", help="sizes estimated from the timed ones ('' for none)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=4,
                   help="interleaved rounds (default 4: even, so ncnn and torch at each size run in each "
                        "order in half of them; perf_timing.round_order)")
    p.add_argument("--build", type=Path, default=Path("build/youtu-vl/vision-bench"))
    p.add_argument("--precision", default="fp32",
                   help="runtime/precision.py name the ncnn blocks run (ncnn option precisions; torch stays fp32)")
    p.add_argument("--window-calls", type=int, default=WINDOW_CONCURRENT_CALLS,
                   help="windows run side by side (the window segments' concurrent_calls; the package "
                        f"uses {WINDOW_CONCURRENT_CALLS}): to measure another split of the threads")
    args = p.parse_args(argv)
    if args.window_calls < 1:
        p.error("--window-calls: give 1 or more")
    cfg = VisionConfig()
    try:
        cases = [case_for(size, cfg) for size in args.sizes.split(",") if size]
        extra = [case_for(size, cfg) for size in args.extrapolate.split(",") if size]
        gate = layer_gate(bench_precision(args.precision))
    except ValueError as exc:
        p.error(str(exc))
    if not cases:
        p.error("--sizes: give at least one HxW size to time")
    import torch

    torch.set_num_threads(args.threads)
    tower, graphs = build_graphs(cfg, args.build)
    runners = open_runners(graphs, two_block_config(cfg), args.threads, args.precision, args.window_calls)
    rows = []
    for case in cases:
        rows.append(measure_case(case, tower, runners, cfg, args.rounds, gate))
        print(f"timed {case.label}: {rows[-1]}", file=sys.stderr, flush=True)
    largest = max(range(len(cases)), key=lambda i: cases[i].patches)
    rows += [extrapolate(case, cases[largest], rows[largest]) for case in extra]
    from ncnnport.runtime.machine import cpu_record

    cpu = cpu_record()
    split = runners["window"].split
    print(f"machine: {cpu['cpu_model']} ({cpu['arch']}: {' '.join(cpu['isa_features']) or 'baseline ISA'}); "
          f"ncnn {args.precision}, torch fp32 eager; threads {args.threads}; {args.rounds} rounds; "
          f"windows side by side: {split.workers} at a time, {split.threads_each} threads each")
    print("\n".join(table(rows, cfg, args.threads, args.precision, gate)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
