"""Time and peak RSS of one SeedVR2 image restored end to end, in a process of its own.

Why a process per run: peak RSS (``ru_maxrss``) is a high-water mark of the whole process, so
the ncnn and the torch runs cannot share one (as ``tile_measure``, which measures one VAE call).
One run restores ``cpp_bench.image(H, W)`` at its own area (no resize): preprocess, VAE encode,
DiT, the Euler step, VAE decode and the colour fix, the VAE tiled by ``--tile``/``--overlap``
(``tiles.py``'s rule, the same for both runtimes), and prints one JSON line: seconds in all and
per stage (``cpp_bench.StageTimer``'s names; ``host`` is the rest: preprocess, Euler, colour fix,
uint8), the process's peak RSS, the peak after each stage, the RSS before the call, the load
average, and the frames' distance to ``--compare`` (the other runtime's ``--save``) under the
model's fp32 frames gate.

* ``--runtime ncnn``: the converted package as ``ncnnport run seedvr2 --package`` drives it
  (``LazyModules``: each graph opened on first use; numpy host ops; the package's text
  embedding and tables; ``--low-memory`` as the run verb's: pools emptied after each VAE call and
  each stage's graphs closed when it is done). torch is never imported.
* ``--runtime torch``: the fp32 reference (``TorchBackend``, materialised before the clock)
  with torch's host ops.

Both draw the same noise from numpy's generator (``host.numpy_noise``, ``--seed``): the official
torch stream would import torch into the ncnn process and count its libraries in the peak.

    nice -n 10 python -m ncnnport.models.seedvr2.e2e_measure --runtime ncnn --size 720x1280 \\
        --tile 256 --overlap 64 --threads 2 --low-memory --preset real --layers 2 \\
        --save build/reports/seedvr2/e2e/ncnn_720p.npy
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ncnnport.models.seedvr2.cpp_bench import StageTimer, image
from ncnnport.models.seedvr2.tile_measure import (FolderGraphs, Progress, emit, current_rss_bytes, default_package,
                                                  peak_rss_bytes)

Restore = Callable[[Any, np.ndarray, Any, int], Any]  # (backend, video, noise, area) -> host.Result


@dataclass
class Prepared:
    """A runtime ready to restore: its config, its untiled pipeline backend and its flow."""

    cfg: Any
    backend: Any
    restore: Restore


class StagePeaks(StageTimer):
    """``StageTimer`` that also keeps the process's peak RSS after each stage's last call, so the
    one JSON line says which stage set the peak."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.peaks: dict[str, float] = {}

    def _timed(self, method: str, *args: Any) -> Any:
        out = super()._timed(method, *args)
        self.peaks[self.NAMES[method]] = round(peak_rss_bytes() / 1e9, 2)
        return out


def parse_size(text: str) -> tuple[int, int]:
    """``HxW`` -> (H, W), or one ValueError line naming ``--size``."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size {text}: expected HxW, e.g. 720x1280") from None
    if h < 16 or w < 16 or h % 16 or w % 16:
        raise ValueError(f"--size {text}: both sides must be multiples of 16 (the pipeline's crop), at least 16")
    return h, w


def prepare_ncnn(package: Path, threads: int, low_memory: bool, checked: bool = True) -> Prepared:
    """The package's graphs, host tables and text embedding, as ``run seedvr2 --package``
    opens them (graphs load on first use, inside the measured call; kept open, or with
    ``low_memory`` closed stage by stage).
    ``checked=False`` skips the manifest check (``tile_measure.FolderGraphs``: a package whose
    convert was stopped while writing its cases); the graphs and their options are the same."""
    from ncnnport.fsutil import read_json
    from ncnnport.models.seedvr2 import packaged
    from ncnnport.models.seedvr2.runner import GraphBackend
    from ncnnport.runtime.lazy_modules import LazyModules
    from ncnnport.runtime.options import RuntimeOptions

    rt = packaged.open_packaged(package, read_json(package / "model.json"))
    options = RuntimeOptions(num_threads=threads, low_memory=low_memory)
    graphs = LazyModules(package, options=options) if checked else FolderGraphs(package, options)
    # as the run verb: under --low-memory each stage's graphs close when the stage is done
    backend = GraphBackend(rt.cfg, graphs.get, graphs.release, trig=rt.trig, release_stages=low_memory,
                           has=graphs.__contains__)
    return Prepared(rt.cfg, backend,
                    lambda backend, video, noise, area: packaged.restore(rt, backend, video, noise, area))


def prepare_torch(preset: str, layers: int | None, threads: int) -> Prepared:
    """The fp32 torch reference with every weight materialised now (before the clock)."""
    import torch

    from ncnnport.models.seedvr2.pipeline import TorchBackend, restore
    from ncnnport.models.seedvr2.port import PORT

    torch.set_num_threads(threads)
    ref = PORT.load(preset, None, layers=layers).reference
    text = ref.text.numpy()
    return Prepared(ref.config, TorchBackend(ref.dit, ref.vae),
                    lambda backend, video, noise, area: restore(ref.config, backend, video, text, noise, area=area))


def frames_distance(frames: np.ndarray, path: Path, policy: Path) -> dict[str, Any]:
    """``frames`` against an earlier run's saved frames: the 8-bit statistics and the model's
    fp32 frames gate (cosine over image rows, at most 1 level), as parity judges them."""
    from ncnnport.metrics import compare, judge
    from ncnnport.models.seedvr2.frames import image_rows, image_stats
    from ncnnport.models.seedvr2.port import POLICY_STAGES
    from ncnnport.parity.policy import Policy

    ref = np.load(path, allow_pickle=False)
    if ref.shape != frames.shape or ref.dtype != np.uint8:
        raise ValueError(f"--compare {path}: uint8 frames {list(frames.shape)} expected, "
                         f"got {ref.dtype} {list(ref.shape)}")
    stats = compare(image_rows(ref), image_rows(frames), what="frames")
    ok, why = judge(stats, Policy.load(policy, stages=POLICY_STAGES).stage("frames", "fp32"))
    return {"file": str(path), **image_stats(ref, frames), "cosine": stats.cosine,
            "worst_row_cosine": stats.worst_row_cosine, "frames_gate": "pass" if ok else f"fail: {why}"}


def measure(prepared: Prepared, spec: Any, video: np.ndarray, seed: int) -> tuple[dict[str, Any], np.ndarray]:
    """One timed restoration of ``video`` at its own area: (record, frames)."""
    from ncnnport.models.seedvr2.host import latent_shape_for, numpy_noise
    from ncnnport.models.seedvr2.tiles import tiled

    cfg = prepared.cfg
    area = video.shape[1] * video.shape[2]
    noise = numpy_noise(latent_shape_for(cfg, video, area), seed)
    timer = StagePeaks(tiled(Progress(prepared.backend), spec, cfg.vae.spatial_factor))
    load_before = os.getloadavg()
    before = current_rss_bytes()
    t0 = time.perf_counter()
    frames = prepared.restore(timer, video, noise, area).frames
    total = time.perf_counter() - t0
    stages = {k: round(v, 2) for k, v in timer.seconds.items()}
    stages["host"] = round(total - sum(timer.seconds.values()), 2)
    rec = {"seconds": round(total, 2), "stage_seconds": stages, "peak_rss_gb": round(peak_rss_bytes() / 1e9, 2),
           "peak_rss_after_stage_gb": timer.peaks, "rss_before_call_gb": round(before / 1e9, 2),
           "frames_shape": list(frames.shape), "noise": f"numpy seed {seed}",
           "load_average_before": [round(v, 1) for v in load_before],
           "load_average_after": [round(v, 1) for v in os.getloadavg()], "cpus": os.cpu_count()}
    return rec, frames


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=("ncnn", "torch"), required=True)
    ap.add_argument("--size", default="720x1280", help="HxW pixels of the image (restored at its own area)")
    ap.add_argument("--tile", type=int, default=None, help="VAE tile px (default: untiled)")
    ap.add_argument("--overlap", type=int, default=None, help="VAE tile overlap px (default: a quarter tile)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--low-memory", action="store_true", help="ncnn: empty the VAE graphs' pools after each call")
    ap.add_argument("--seed", type=int, default=666, help="numpy noise seed")
    ap.add_argument("--preset", default="real")
    ap.add_argument("--layers", type=int, default=2, help="DiT blocks (the VAE is always whole)")
    ap.add_argument("--build-dir", type=Path, default=Path("build"))
    ap.add_argument("--package", type=Path, default=None,
                    help="ncnn graphs from this package folder, opened without the manifest check "
                         "(default: BUILD/seedvr2/PRESET-LK/package, made by `ncnnport convert`, checked)")
    ap.add_argument("--save", type=Path, default=None, help="save the frames (.npy) for a later --compare")
    ap.add_argument("--compare", type=Path, default=None, help="an earlier --save (the other runtime's frames)")
    ap.add_argument("--json", type=Path, default=None, help="also write the JSON line here")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from ncnnport.models.seedvr2.tiles import tile_spec

    try:
        height, width = parse_size(args.size)
        spec = tile_spec(args.tile, args.overlap, 8)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.compare is not None and not args.compare.is_file():
        print(f"error: --compare {args.compare}: no such file", file=sys.stderr)
        return 2
    package = args.package or default_package(args.build_dir, args.preset, args.layers)
    if args.runtime == "ncnn":
        if not (package / "model.json").is_file():
            print(f"error: no package at {package}: run `ncnnport convert seedvr2 --preset {args.preset} "
                  f"--layers {args.layers}` first, or pass --package", file=sys.stderr)
            return 2
        prepared = prepare_ncnn(package, args.threads, args.low_memory, checked=args.package is None)
    else:
        prepared = prepare_torch(args.preset, args.layers, args.threads)
    rec, frames = measure(prepared, spec, image(height, width), args.seed)
    rec = {"runtime": args.runtime, "stage": "e2e", "size": f"{height}x{width}", "preset": args.preset,
           "dit_blocks": prepared.cfg.dit.num_layers, "threads": args.threads, "low_memory": args.low_memory,
           "tile": None if spec is None else spec.tile, "overlap": None if spec is None else spec.overlap, **rec}
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        np.save(args.save, frames)
    if args.compare is not None:
        try:
            rec["vs"] = frames_distance(frames, args.compare, Path(__file__).with_name("policy.json"))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    emit(rec, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
