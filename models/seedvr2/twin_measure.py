"""Torch vs the general VAE graphs vs their single-frame twins on one image, timed interleaved.

Why a tool of its own: the twins (``runner.image_graph``) are what an image runs, so ``bench``
times them; this puts the general graphs beside them on the same inputs, in the same rounds, to
show what the twins change and that they compute the same thing (max_abs and cosine of each
against torch). Rounds change the order so no runtime always runs after the same one.

    python -m ncnnport.models.seedvr2.twin_measure --stage vae_decode --size 256x256 --threads 2 --layers 2
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any, Callable

import numpy as np


def agreement(ref: np.ndarray, got: np.ndarray) -> str:
    """max_abs (with max|ref|) and the global cosine of ``got`` against ``ref`` (metrics.compare)."""
    from ncnnport.metrics import compare

    st = compare(ref, got, what="twin_measure")
    return f"max_abs {st.max_abs:.3e} (max|ref| {st.ref_absmax:.3f}), cosine {st.cosine:.8f}"


def rotated_rounds(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call, every callable once per round, the order changing round by round
    (perf_timing.interleaved_ms: a rotation, then its reverse)."""
    from ncnnport.runtime.perf_timing import interleaved_ms

    times = interleaved_ms(list(calls.values()), rounds)
    return {k: [ms / 1e3 for ms in t] for k, t in zip(calls, times)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=["vae_decode", "vae_encode"], default="vae_decode")
    ap.add_argument("--size", default="256x256", help="HxW pixels of the image")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--low-memory", action="store_true", help="empty the VAE graphs' pools after each call")
    ap.add_argument("--preset", default="real")
    ap.add_argument("--layers", type=int, default=None, help="DiT blocks of the package (the VAE is always whole)")
    ap.add_argument("--build-dir", type=Path, default=Path("build"))
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.threads < 1:
        ap.error("--rounds and --threads must be >= 1")
    try:
        h, w = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        ap.error(f"--size {args.size!r}: use HxW, e.g. 256x256")
    if h <= 0 or w <= 0 or h % 16 or w % 16:
        ap.error(f"--size {args.size}: height and width must be positive multiples of 16")

    import torch

    from ncnnport.fsutil import read_json
    from ncnnport.models.seedvr2 import bench, packaged
    from ncnnport.models.seedvr2.port import PORT
    from ncnnport.models.seedvr2.runner import GraphBackend
    from ncnnport.models.seedvr2.tile_measure import default_package
    from ncnnport.runtime.lazy_modules import LazyModules
    from ncnnport.runtime.options import RuntimeOptions

    package = default_package(args.build_dir, args.preset, args.layers)
    if not (package / "model.json").is_file():
        layers = f" --layers {args.layers}" if args.layers is not None else ""
        ap.error(f"{package}: no package (run `ncnnport convert seedvr2 --preset {args.preset}{layers}`)")
    torch.set_num_threads(args.threads)
    model = PORT.load(args.preset, None, layers=args.layers).reference
    rt = packaged.open_packaged(package, read_json(package / "model.json"))
    graphs = LazyModules(package, options=RuntimeOptions(num_threads=args.threads, low_memory=args.low_memory))
    calls = {"torch": bench.torch_call(model, args.stage, args.size),
             "ncnn_general": bench.ncnn_call(model, GraphBackend(rt.cfg, graphs.get), args.stage, args.size),
             "ncnn_twins": bench.ncnn_call(model, GraphBackend(rt.cfg, graphs.get, has=graphs.__contains__),
                                           args.stage, args.size)}
    first = {k: call()[0] for k, call in calls.items()}  # warm: opens the graphs
    for k in ("ncnn_general", "ncnn_twins"):
        print(f"{args.stage} {args.size} {k} vs torch: {agreement(first['torch'], first[k])}")
    times = rotated_rounds(calls, args.rounds)
    print(f"{args.stage} {args.size}, {args.threads} threads, {args.rounds} rounds, medians: "
          + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in times.items()))
    for num, den in (("torch", "ncnn_general"), ("torch", "ncnn_twins"), ("ncnn_general", "ncnn_twins")):
        ratios = [a / b for a, b in zip(times[num], times[den])]
        print(f"  {num}/{den}: median of per-round ratios {statistics.median(ratios):.2f}x "
              f"{[round(r, 2) for r in ratios]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
