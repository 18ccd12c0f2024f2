"""Time and peak RSS of one SeedVR2 VAE call, untiled or tiled, in a process of its own.

Why a process per measurement: peak RSS (``ru_maxrss``) is a high-water mark of the whole
process, so ncnn and torch, or tiled and untiled, cannot share one. Each run prints one JSON
line (and ``--json FILE`` keeps it): the runtime, the work, the seconds of the call, the
process's peak RSS, the RSS right before the call (weights and runtime loaded) and the VAE
output's distance to ``--compare`` (an earlier run's saved output) when given.

    python -m ncnnport.models.seedvr2.tile_measure --runtime ncnn --stage decode --size 512x512 \
        --tile 256 --threads 2 --preset real --layers 2 --json build/reports/seedvr2/tiles/x.json

Inputs are ``bench.bench_inputs`` (seeded: every process sees the same latent / pixels).
The ncnn side reads a converted package (``ncnnport convert seedvr2 --preset P --layers K``;
default ``BUILD/seedvr2/P-LK/package``): a model module never drives the build stages.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np


def peak_rss_bytes() -> int:
    """This process's peak resident set (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class TorchVAE:
    """The fp32 torch reference's VAE half as a pipeline Backend (``TorchBackend``'s encode and
    decode without the DiT): a lazy real-width model materialises only that half, as the bench does."""

    def __init__(self, vae: Any) -> None:
        self.vae = vae.eval()

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.inference_mode():
            m, lv = self.vae.encode_moments(torch.from_numpy(x))
        return m.numpy(), lv.numpy()

    def decode(self, z: np.ndarray) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.vae.decode(torch.from_numpy(z)).numpy()


class Progress:
    """Prints one line per VAE call (per tile when tiled): its seconds and the process's peak
    RSS so far, so a run cut short still shows the per-tile cost and the (per-tile) peak."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls, self.t0 = inner, 0, time.perf_counter()

    def _timed(self, fn: Callable[[], Any]) -> Any:
        t = time.perf_counter()
        out = fn()
        self.calls += 1
        print(f"call {self.calls}: {time.perf_counter() - t:.1f} s, peak RSS {peak_rss_bytes() / 1e9:.2f} GB, "
              f"{time.perf_counter() - self.t0:.0f} s in all", file=sys.stderr, flush=True)
        return out

    def __getattr__(self, name: str) -> Any:
        """Everything else (the DiT, ``host_dtype``) is the wrapped backend's: an end-to-end
        run (``e2e_measure``) reports its VAE tiles through the same wrapper."""
        return getattr(self.inner, name)

    def encode(self, x: np.ndarray) -> Any:
        return self._timed(lambda: self.inner.encode(x))

    def decode(self, z: np.ndarray) -> Any:
        return self._timed(lambda: self.inner.decode(z))


def vae_backend(runtime: str, stage: str, reference: Any, threads: int, low_memory: bool, package: Path) -> Any:
    """The VAE as a pipeline Backend: the package's ncnn graphs (``GraphBackend``) or the torch
    reference."""
    if runtime == "torch":
        import torch

        torch.set_num_threads(threads)
        return TorchVAE(reference.view("vae", ["encoder" if stage == "encode" else "decoder"]))
    from ncnnport.models.seedvr2.runner import GraphBackend
    from ncnnport.runtime.options import RuntimeOptions

    options = RuntimeOptions(num_threads=threads, low_memory=low_memory)
    graphs = FolderGraphs(package, options)
    return GraphBackend(reference.config, graphs.get, has=graphs.__contains__)


def default_package(build_dir: Path, preset: str, layers: int | None) -> Path:
    """Where ``ncnnport convert seedvr2 --preset P [--layers K]`` writes its package."""
    return Path(build_dir) / "seedvr2" / (preset if layers is None else f"{preset}-L{layers}") / "package"


class FolderGraphs:
    """Graphs opened by name from a package folder's ``ncnn/`` and ``specs/`` on first use,
    without the manifest check (``--package``: measure a package still being finished)."""

    def __init__(self, folder: Path, options: Any) -> None:
        self.folder, self.options, self.open = Path(folder), options, {}

    def get(self, name: str) -> Any:
        from ncnnport.runtime.session import NcnnModule

        if name not in self.open:
            spec = json.loads((self.folder / "specs" / f"{name}.spec.json").read_text())
            self.open[name] = NcnnModule(self.folder / "ncnn" / f"{name}.ncnn.param",
                                         self.folder / "ncnn" / f"{name}.ncnn.bin", spec, self.options)
        return self.open[name]

    def release(self, name: str) -> None:
        """Close graph ``name`` (as ``Runners.release``; a later ``get`` reopens it)."""
        self.open.pop(name, None)

    def __contains__(self, name: str) -> bool:
        """Whether the folder holds graph ``name`` (without opening it)."""
        return (self.folder / "specs" / f"{name}.spec.json").is_file()


def emit(rec: dict[str, Any], path: Path | None) -> None:
    """The measurement's one JSON line on stdout, and in ``path`` (``--json``) when given."""
    line = json.dumps(rec)
    print(line)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n")


def stage_call(backend: Any, stage: str, x: np.ndarray, z: np.ndarray) -> Callable[[], np.ndarray]:
    if stage == "decode":
        return lambda: backend.decode(z)
    return lambda: backend.encode(x)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=("ncnn", "torch"), required=True)
    ap.add_argument("--stage", choices=("decode", "encode"), default="decode")
    ap.add_argument("--size", default="512x512", help="HxW pixels of one image")
    ap.add_argument("--tile", type=int, default=None, help="tile px (default: untiled)")
    ap.add_argument("--overlap", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--low-memory", action="store_true")
    ap.add_argument("--preset", default="real")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--build-dir", type=Path, default=Path("build"))
    ap.add_argument("--save", type=Path, default=None, help="save the output (.npy) for a later --compare")
    ap.add_argument("--compare", type=Path, default=None, help="an earlier --save to compare against")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--package", type=Path, default=None,
                    help="ncnn graphs from this package folder, opened without the manifest check "
                         "(default: BUILD/seedvr2/PRESET-LK/package, made by `ncnnport convert`)")
    args = ap.parse_args(argv)

    from ncnnport.models.seedvr2.bench import bench_inputs
    from ncnnport.models.seedvr2.tiles import tile_spec, tiled
    from ncnnport.models.seedvr2.port import PORT

    try:
        spec = tile_spec(args.tile, args.overlap, 8)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    package = args.package or default_package(args.build_dir, args.preset, args.layers)
    if args.runtime == "ncnn" and not (package / "specs").is_dir():
        layers = "" if args.layers is None else f" --layers {args.layers}"
        print(f"error: no package at {package}: run `ncnnport convert seedvr2 --preset {args.preset}{layers}` "
              "first, or pass --package", file=sys.stderr)
        return 2
    reference = PORT.load(args.preset, None, layers=args.layers).reference
    cfg = reference.config
    x, _, z = bench_inputs(cfg, args.size)
    backend = tiled(Progress(vae_backend(args.runtime, args.stage, reference, args.threads, args.low_memory, package)),
                    spec, cfg.vae.spatial_factor)
    call = stage_call(backend, args.stage, x, z)
    before = current_rss_bytes()
    t0 = time.perf_counter()
    out = call()
    seconds = time.perf_counter() - t0
    rec: dict[str, Any] = {"runtime": args.runtime, "stage": f"vae_{args.stage}", "size": args.size,
                           "preset": args.preset, "threads": args.threads, "low_memory": args.low_memory,
                           "tile": None if spec is None else spec.tile,
                           "overlap": None if spec is None else spec.overlap,
                           "seconds": round(seconds, 2), "peak_rss_gb": round(peak_rss_bytes() / 1e9, 2),
                           "rss_before_call_gb": round(before / 1e9, 2), "output_shape": list(out.shape),
                           "load_average_after": [round(v, 1) for v in os.getloadavg()], "cpus": os.cpu_count()}
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        np.save(args.save, out)
    if args.compare is not None:
        ref = np.load(args.compare, allow_pickle=False)
        d = np.abs(ref.astype(np.float64) - out)
        rec["vs"] = {"file": str(args.compare), "max_abs": float(d.max()), "mean_abs": float(d.mean()),
                     "ref_absmax": float(np.abs(ref).max())}
    emit(rec, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
