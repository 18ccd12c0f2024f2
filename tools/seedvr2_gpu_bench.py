"""GPU machine only (run by hand, never by CI): SeedVR2-3B at real widths (seeded real preset,
LAYERS=2) built with ncnnport's own stages on the device, then timed: ncnn Vulkan fp32 / fp16
and ncnn CPU vs torch eager CUDA and CPU, for one DiT block (``dit_block``, block 0: pre graph,
every window's attention, post graph) and the VAE encoder / decoder (``vae_encode`` /
``vae_decode``) at 256x256 and 512x512. Medians of repeated runs; the work per stage is the
bench stage factories' (``models/seedvr2/bench.py``: ``ncnn_call`` through the port's
``bench_call``, ``torch_call`` through ``torch_bench_call``); torch on CUDA runs the same views
and inputs moved to the GPU (:func:`torch_device_call`, TF32 off: a true fp32 reference).

Parity columns: every backend's outputs vs the torch fp32 CPU outputs on the same inputs (worst
over the stage's outputs): cosine and max_abs / max|ref| (``ncnnport.metrics.compare``).

Notes on what the numbers include: ncnn calls take numpy in and out (host<->GPU copies inside
every Vulkan call); torch CUDA keeps inputs and outputs on the GPU and synchronises per call.
ncnn 20261020 has no Vulkan Convolution3D, so in the Vulkan rows the VAE's Conv3D layers fall
back to the CPU: every ncnn option set here uses ``THREADS`` CPU threads for that reason.

Time box: ``BUDGET_S`` seconds after start no new measurement starts; a backend whose first call
is estimated (from rows already measured) not to fit is recorded as skipped; timed runs stop
when the next would overrun. ncnn rows keep ``RESERVE_S`` seconds back for the torch rows after
them. JSON is written after every row, so a ``timeout`` kill loses one row at most.

Usage on the device: ``.dev/device_seedvr2.sh`` (Vulkan loader, wheels, env), i.e.
    OUT=out BUDGET_S=520 python3 tools/seedvr2_gpu_bench.py
Local smoke test (no GPU: the CUDA and Vulkan rows are left out):
    PRESET=tiny SIZES=32x32 RUNS_SCALE=0.2 OUT=/tmp/sv2 python3 tools/seedvr2_gpu_bench.py
Other knobs: LAYERS (2), STAGES (dit_block,vae_encode,vae_decode), SIZES (256x256,512x512),
THREADS (16), NCNNPORT_DEVICE_BUILD (build root), ROWS (``stage:size,...`` in this order, instead
of STAGES x SIZES), BACKENDS (row labels to run; the torch CPU parity reference always runs),
ESTIMATES (``stage:size=seconds,...``: ncnn first-call estimates from an earlier run, for the
time box). ``--table FILE.json`` prints a saved table.
Writes ``seedvr2_gpu.json`` into ``$OUT`` after every row and prints a markdown table.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

AnyCall = Callable[[], Sequence[Any]]

T0 = time.perf_counter()
STAGE_ORDER = ("dit_block", "vae_encode", "vae_decode")
# (warm-up calls incl. the first, timed runs) per stage and backend kind; the VAE's ncnn Conv3D is
# slow on the CPU (one 256x256 encode: 148 s on 1 thread of a 2-core x86 machine)
RUNS: dict[str, dict[str, tuple[int, int]]] = {
    "dit_block": {"torch_gpu": (3, 15), "torch_cpu": (2, 10), "ncnn_gpu": (3, 15), "ncnn_cpu": (2, 10)},
    "vae_encode": {"torch_gpu": (2, 5), "torch_cpu": (1, 3), "ncnn_gpu": (1, 2), "ncnn_cpu": (1, 1)},
    "vae_decode": {"torch_gpu": (2, 5), "torch_cpu": (1, 3), "ncnn_gpu": (1, 2), "ncnn_cpu": (1, 1)},
}


def env_list(name: str, default: Sequence[str]) -> list[str]:
    v = os.environ.get(name)
    return [s for s in v.split(",") if s] if v else list(default)


def area(size: str) -> int:
    h, w = (int(v) for v in size.lower().split("x"))
    return h * w


def to_numpy(outs: Sequence[Any]) -> list[np.ndarray]:
    return [o.detach().float().cpu().numpy() if hasattr(o, "detach") else np.asarray(o) for o in outs]


def parity(ref: list[np.ndarray], outs: list[np.ndarray]) -> tuple[float, float, int]:
    """Worst (cosine, max_abs / max|ref|) over the outputs and the count of NaN/Inf values (any
    makes the cosine NaN and the error inf); a candidate with the reference's element count is
    reshaped to it (ncnn keeps a leading batch axis the torch block has not)."""
    from ncnnport.metrics import compare

    if len(ref) != len(outs):
        raise ValueError(f"{len(outs)} outputs vs {len(ref)} in the reference")
    cos, rel, bad = 1.0, 0.0, 0
    for i, (r, o) in enumerate(zip(ref, outs)):
        o = o.reshape(r.shape) if o.size == r.size else o
        s = compare(r, o, what=f"output {i}")
        bad += s.nan + s.inf
        cos, rel = min(cos, s.cosine), max(rel, s.max_abs / max(s.ref_absmax, 1e-30))
    return (float("nan") if bad else cos), (float("inf") if bad else rel), bad


def torch_device_call(model: Any, stage: str, size: str, device: str) -> AnyCall:
    """``bench.torch_call``'s work on ``device``: the same model views and ``bench_inputs``, with
    the weights, inputs, window indices and RoPE tables all moved there (the window plan and
    RoPE tables are computed on the CPU first: ``MMRoPE3d.tables`` builds CPU constants).
    Outputs stay on the device; every call synchronises."""
    import torch

    from ncnnport.models.seedvr2.bench import bench_inputs
    from ncnnport.models.seedvr2.dit import WindowPlan
    from ncnnport.models.seedvr2.mmrope import text_positions

    cfg = model.config
    x, cond, z = bench_inputs(cfg, size)
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    if stage == "vae_encode":
        # a lazy view holds the encoder only (the decoder stays on meta): move just the encoder
        vae = copy.deepcopy(model.view("vae", ["encoder"]))
        vae.encoder.to(dev)
        xd = torch.from_numpy(x).to(dev)

        def encode() -> list[Any]:
            with torch.inference_mode():
                r = list(vae.encode_moments(xd))
            sync()
            return r
        return encode
    if stage == "vae_decode":
        vae = copy.deepcopy(model.view("vae", ["decoder"]))
        vae.decoder.to(dev)
        zd = torch.from_numpy(z).to(dev)

        def decode() -> list[Any]:
            with torch.inference_mode():
                r = [vae.decode(zd)]
            sync()
            return r
        return decode
    if stage != "dit_block":
        raise NotImplementedError(f"stage {stage!r}")
    dit = model.view("dit", ["vid_in", "txt_in", "emb_in"])
    cpu_block = model.part("dit.blocks.0")
    T, H, W, _ = cond.shape
    grid, L = (T, H // 2, W // 2), model.text.shape[0]
    with torch.inference_mode():
        v, t = dit.embed_inputs(torch.from_numpy(cond), model.text)
        emb = dit.emb_in(cfg.timestep)
        rope = cpu_block.attn.rope
        plan = dit.window_plan(grid, cpu_block.shifted, L, rope)
        tc, ts = rope.tables(torch.from_numpy(text_positions(L)))
    # the tiny preset's views are the model's own submodules: never move those in place
    block = copy.deepcopy(cpu_block).to(dev)
    v, t, emb, tc, ts = (a.to(dev) for a in (v, t, emb, tc, ts))
    plan = WindowPlan([i.to(dev) for i in plan.index], [c.to(dev) for c in plan.cos], [s.to(dev) for s in plan.sin])

    def call() -> list[Any]:
        with torch.inference_mode():
            r = list(block(v, t, emb, plan, tc, ts))
        sync()
        return r
    return call


class Bench:
    """Rows, the time box and the JSON file."""

    def __init__(self, out: Path, budget_s: float, reserve_s: float, meta: dict[str, Any]) -> None:
        self.out, self.meta = out, meta
        self.rows: list[dict[str, Any]] = []
        self.deadline = T0 + budget_s
        # ESTIMATES="vae_decode:256x256=70,...": an earlier run's ncnn first-call seconds per row
        self.prior = {k: float(v) for k, _, v in (e.partition("=") for e in env_list("ESTIMATES", []))}
        self.reserve = reserve_s

    def left(self, reserve: bool) -> float:
        return self.deadline - (self.reserve if reserve else 0.0) - time.perf_counter()

    def estimate_first_s(self, stage: str, size: str, backend: str) -> float | None:
        """A first call's seconds from rows already measured: the slowest ncnn backend of the same
        stage and size (the VAE's Conv3D runs on the CPU in every ncnn row), else the same
        backend at another size scaled by pixel area."""
        same = [r["first_ms"] for r in self.rows if r["stage"] == stage and r["size"] == size
                and r["backend"].startswith("ncnn") and r["first_ms"] is not None]
        if same and backend.startswith("ncnn"):
            return max(same) / 1e3
        other = [r["first_ms"] * area(size) / area(r["size"]) for r in self.rows
                 if r["stage"] == stage and r["backend"] == backend and r["first_ms"] is not None]
        if other:
            return max(other) / 1e3
        return self.prior.get(f"{stage}:{size}") if backend.startswith("ncnn") else None

    def measure(self, stage: str, size: str, backend: str, make: Callable[[], AnyCall], kind: str,
                ref: list[np.ndarray] | None, note: str = "") -> list[np.ndarray] | None:
        """Build the call, run it (first call timed and kept for parity), warm up, then timed runs
        while the time box allows; append the row and rewrite the JSON. Returns the first output."""
        warm, runs = RUNS[stage][kind]
        scale = float(os.environ.get("RUNS_SCALE", "1"))
        warm, runs = max(1, round(warm * scale)), max(1, round(runs * scale))
        reserve = kind.startswith("ncnn")
        est = self.estimate_first_s(stage, size, backend)
        row: dict[str, Any] = {"stage": stage, "size": size, "backend": backend, "median_ms": None, "min_ms": None,
                               "runs": 0, "first_ms": None, "cos_vs_torch_cpu": None, "rel_vs_torch_cpu": None,
                               "setup_s": None, "note": note}
        if self.left(reserve) <= 0 or (est is not None and est > self.left(reserve)):
            row["note"] = (f"skipped: first call est. {est:.0f} s" if est is not None else "skipped") + \
                f", {max(self.left(reserve), 0):.0f} s of the time box left"
            self._add(row)
            return None
        t = time.perf_counter()
        call = make()
        row["setup_s"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        first = to_numpy(call())
        last = time.perf_counter() - t
        row["first_ms"] = last * 1e3
        if ref is not None:
            row["cos_vs_torch_cpu"], row["rel_vs_torch_cpu"], bad = parity(ref, first)
            if bad:
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"{bad} NaN/Inf values in the outputs"
        for _ in range(warm - 1):
            if last > self.left(reserve):
                break
            t = time.perf_counter()
            call()
            last = time.perf_counter() - t
        ts: list[float] = []
        while len(ts) < runs and last < self.left(reserve):
            t = time.perf_counter()
            call()
            last = time.perf_counter() - t
            ts.append(last * 1e3)
        if ts:
            row["median_ms"], row["min_ms"], row["runs"] = statistics.median(ts), min(ts), len(ts)
        if len(ts) < runs:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"time box: {len(ts)}/{runs} runs"
        del call
        self._add(row)
        return first

    def _add(self, row: dict[str, Any]) -> None:
        row["t_s"] = round(time.perf_counter() - T0, 1)
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        (self.out / "seedvr2_gpu.json").write_text(json.dumps({**self.meta, "rows": self.rows}, indent=1))


def table(rows: Sequence[dict[str, Any]]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)
    lines = ["| stage | size | backend | median ms | min ms | runs | first call ms | cosine vs torch fp32 cpu "
             "| max_abs/max|ref| | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['size']} | {r['backend']} | {num(r['median_ms'], '.2f')} | "
                     f"{num(r['min_ms'], '.2f')} | {r['runs']} | {num(r['first_ms'], '.1f')} | "
                     f"{num(r['cos_vs_torch_cpu'], '.7f')} | {num(r['rel_vs_torch_cpu'], '.2e')} | {r['note']} |")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(json.loads(Path(sys.argv[2]).read_text())["rows"]))
        return 0
    import ncnn
    import torch

    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.runtime.lazy_modules import open_ncnn_modules
    from ncnnport.targets import Target

    preset, layers = os.environ.get("PRESET", "real"), int(os.environ.get("LAYERS", "2"))
    threads = int(os.environ.get("THREADS", "16"))
    stages = env_list("STAGES", STAGE_ORDER)
    sizes = env_list("SIZES", ["256x256", "512x512"])
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="seedvr2_gpu_"))
    out.mkdir(parents=True, exist_ok=True)
    build = Path(os.environ.get("NCNNPORT_DEVICE_BUILD") or tempfile.mkdtemp(prefix="seedvr2_build_"))
    gpu = ncnn.get_gpu_count() > 0
    cuda = torch.cuda.is_available()
    # a true fp32 reference on the GPU (Hopper would otherwise run cuDNN convs in TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    t = time.perf_counter()
    prep = prepare(Target("seedvr2", preset, None, build, layers=layers))
    pkg = convert_stage(prep)
    build_s = time.perf_counter() - t
    print(f"built seedvr2 {preset} L{layers} in {build_s:.0f} s ({pkg})", flush=True)
    port, loaded = prep.port, prep.loaded
    model = loaded.reference
    meta = {"preset": preset, "layers": layers, "threads": threads, "build_s": round(build_s, 1),
            "torch": torch.__version__, "ncnn_gpus": ncnn.get_gpu_count(),
            "cuda": torch.cuda.get_device_name(0) if cuda else None, "tf32": False}
    bench = Bench(out, float(os.environ.get("BUDGET_S", "inf")), float(os.environ.get("RESERVE_S", "45")), meta)

    from ncnnport.models.seedvr2.runner import block_names, decode_stage_names

    graphs = {"dit_block": ["dit_input", "dit_embedding", *block_names(0), "dit_attention"],
              "vae_encode": ["vae_encode"], "vae_decode": decode_stage_names(model.config)}
    ncnn_backends: list[tuple[str, RuntimeOptions, str]] = []
    if gpu:
        vk = RuntimeOptions(num_threads=threads, use_vulkan=True)
        ncnn_backends += [("ncnn vulkan fp32", vk, "ncnn_gpu"),
                          ("ncnn vulkan fp16", vk.with_(fp16_storage=True, fp16_packed=True, fp16_arithmetic=True),
                           "ncnn_gpu")]
    else:
        print("ncnn sees no GPU: the Vulkan rows are left out", flush=True)
    ncnn_backends.append((f"ncnn cpu t{threads}", RuntimeOptions(num_threads=threads), "ncnn_cpu"))
    if not cuda:
        print("torch sees no CUDA device: the torch cuda rows are left out", flush=True)

    only = env_list("BACKENDS", [])  # labels to run (the torch cpu parity reference always runs)

    def wanted(label: str) -> bool:
        return not only or label in only

    # cheap rows first: the DiT block at every size, then the VAE halves size by size
    plan = [("dit_block", s) for s in sizes if "dit_block" in stages]
    plan += [(st, s) for s in sizes for st in ("vae_encode", "vae_decode") if st in stages]
    if os.environ.get("ROWS"):  # ROWS="vae_decode:256x256,vae_encode:512x512": exactly these, in order
        plan = [(st, s) for st, _, s in (r.partition(":") for r in env_list("ROWS", []))]
    for stage, size in plan:
        torch.set_num_threads(threads)
        ref = bench.measure(stage, size, f"torch eager cpu t{threads}",
                            lambda: port.torch_bench_call(loaded, stage, size), "torch_cpu", None,
                            note="parity reference")
        if cuda and wanted("torch eager cuda"):
            bench.measure(stage, size, "torch eager cuda", lambda: torch_device_call(model, stage, size, "cuda"),
                          "torch_gpu", ref)
            torch.cuda.empty_cache()
        for label, opts, kind in ncnn_backends:
            if not wanted(label):
                continue
            holder: dict[str, Any] = {}

            def make() -> AnyCall:
                holder["mods"] = open_ncnn_modules(pkg, graphs[stage], options=opts)
                return port.bench_call(loaded, holder["mods"], stage, size)
            bench.measure(stage, size, label, make, kind, ref)
            holder.clear()
    print(f"\ntotal {time.perf_counter() - T0:.0f} s (build {build_s:.0f} s)\n")
    print(table(bench.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
