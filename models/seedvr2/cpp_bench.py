"""SeedVR2's workloads for ``ncnnport bench-cpp`` (``ModelPort.cpp_bench_cases``).

One synthetic HxW image (smooth gradients + seeded texture) restored end to end at its own area
(resize, VAE encode, DiT, Euler, VAE decode, colour fix), with noise drawn once for its latent
shape and written as the executable's ``--noise``: the executable, the Python package loop's
``packaged.restore`` and the torch reference's ``restore`` on the same image and noise.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ncnnport.fsutil import read_json
from ncnnport.models.bench_kit import BenchContext, ImageRun, ncnn_modules
from ncnnport.registry import CppBenchCase


def image(height: int, width: int, seed: int = 3) -> np.ndarray:
    """uint8 (1, H, W, 3): gradients plus seeded texture (deterministic, not constant)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([255 * x / max(width - 1, 1), 255 * y / max(height - 1, 1), 128 + 60 * np.sin((x + y) / 9)], -1)
    rgb += np.random.default_rng(seed).normal(0, 12, rgb.shape)
    return np.clip(rgb, 0, 255).astype(np.uint8)[None]


class SeedVR2Bench:
    """The opened package and its graph backend (once for every size) and one
    :class:`CppBenchCase` per image side."""

    def __init__(self, ctx: BenchContext, torch_backend: Any, graph_backend_for: Callable[..., Any]) -> None:
        from ncnnport.models.seedvr2 import packaged

        self.ctx = ctx
        self.torch_backend = torch_backend
        self.rt = packaged.open_packaged(ctx.package, read_json(ctx.package / "model.json"))
        self.backend, _ = graph_backend_for(self.rt.cfg, ncnn_modules(ctx), trig=self.rt.trig)

    def case(self, size: int) -> CppBenchCase:
        """The image, its noise file and every runtime's call on them."""
        from PIL import Image

        from ncnnport.models.seedvr2 import packaged
        from ncnnport.models.seedvr2.cpp_cases import executable_argv, write_noise
        from ncnnport.models.seedvr2.host import latent_shape_for
        from ncnnport.models.seedvr2.pipeline import Noise

        video, area = image(size, size), size * size
        png = self.ctx.workdir / f"image_{size}.png"
        Image.fromarray(video[0]).save(png)
        noise = Noise.seeded(latent_shape_for(self.rt.cfg, video, area), 666)
        noise_file = write_noise(noise, self.ctx.workdir / f"noise_{size}.npz")
        out_dir = self.ctx.workdir / f"frames_{size}"
        argv = [*executable_argv(self.ctx.package, png, noise_file, area, out_dir), "--threads", str(self.ctx.threads),
                "--no-check"]

        def python() -> ImageRun:
            t = time.perf_counter()
            res = packaged.restore(self.rt, self.backend, video, noise, area)
            return ImageRun("python", time.perf_counter() - t, res.frames)

        return CppBenchCase(f"{size}x{size}", "image", argv, python, self.torch_call(video, noise, area),
                            {"area": area, "noise_sha256": noise.record().get("sha256")}, fresh_dir=out_dir)

    def torch_call(self, video: np.ndarray, noise: Any, area: int) -> Callable[[], ImageRun]:
        """The torch reference's ``restore`` on the same image and noise."""
        from ncnnport.models.seedvr2.pipeline import restore

        ref = self.ctx.loaded.reference

        def run() -> ImageRun:
            t = time.perf_counter()
            res = restore(ref.config, self.torch_backend, video, ref.text.numpy(), noise, area=area)
            return ImageRun("torch", time.perf_counter() - t, res.frames)
        return run


def cases(ctx: BenchContext, sizes: Sequence[int], torch_backend: Any,
          graph_backend_for: Callable[..., Any]) -> Iterator[CppBenchCase]:
    """One case per square image side, the package opened once. ``graph_backend_for`` (the port's;
    passed in, as to ``cpp_cases.cases``, since the port imports this file) builds the ncnn backend."""
    bench = SeedVR2Bench(ctx, torch_backend, graph_backend_for)
    for size in sizes:
        yield bench.case(int(size))
