"""SeedVR2's workloads for ``ncnnport bench-cpp`` (``ModelPort.cpp_bench_cases``).

One synthetic HxW image (smooth gradients + seeded texture) restored end to end at its own area
(resize, VAE encode, DiT, Euler, VAE decode, colour fix), with noise drawn once for its latent
shape and written as the executable's ``--noise``: the executable, the Python package loop's
``packaged.restore`` and the torch reference's ``restore`` on the same image and noise.

The torch reference is materialised (and moved to ``ctx.torch_device``) only when its first call
runs, before that call's clock starts: at real widths it is GBs of weights that ``--no-torch``
must not build. The Python and torch calls also record, per round, the seconds of each pipeline
stage under the executable's JSON names (``vae_encode``, ``dit``, ``vae_decode``) in their
``ImageRun.stages``, which the driver tabulates beside the executable's; a device backend
synchronises before a stage's clock stops. Every runtime's peak RSS is the driver's
(``with_peak_rss``). With ``ctx.vulkan`` the Python loop's graphs run on the Vulkan device.
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


class StageTimer:
    """A pipeline backend that forwards every call and adds up the seconds of each stage, named
    as the executable's JSON ``seconds`` names them, so both runtimes' splits line up. Other
    attributes (``host_dtype``) are the wrapped backend's."""

    NAMES = {"encode": "vae_encode", "dit": "dit", "decode": "vae_decode"}

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.seconds: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def _timed(self, method: str, *args: Any) -> Any:
        t = time.perf_counter()
        out = getattr(self.backend, method)(*args)
        getattr(self.backend, "synchronize", lambda: None)()  # a device's queued work is the stage's
        key = self.NAMES[method]
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t
        return out

    def encode(self, x: np.ndarray) -> Any:
        return self._timed("encode", x)

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        return self._timed("dit", cond, txt, t, stages)

    def decode(self, z: np.ndarray) -> np.ndarray:
        return self._timed("decode", z)


def measured(runtime: str, backend: Any, restore: Callable[[Any], Any]) -> ImageRun:
    """One timed ``restore(StageTimer(backend))`` as an ImageRun with its stage seconds."""
    timer = StageTimer(backend)
    t = time.perf_counter()
    frames = restore(timer).frames
    seconds = time.perf_counter() - t
    return ImageRun(runtime, seconds, frames, dict(timer.seconds))


class SeedVR2Bench:
    """The opened package and its graph backend (once for every size) and one
    :class:`CppBenchCase` per image side. ``torch_backend`` is a factory, called once, when the
    first torch call runs."""

    def __init__(self, ctx: BenchContext, torch_backend: Callable[[], Any], graph_backend_for: Callable[..., Any]) -> None:
        from ncnnport.models.seedvr2 import packaged

        self.ctx = ctx
        self.make_torch_backend = torch_backend
        self._torch_backend: Any = None
        self.rt = packaged.open_packaged(ctx.package, read_json(ctx.package / "model.json"))
        self.backend, _ = graph_backend_for(self.rt.cfg, ncnn_modules(ctx), trig=self.rt.trig)

    def torch_backend(self) -> Any:
        """The torch reference's backend (on ``ctx.torch_device``), materialised on first use."""
        if self._torch_backend is None:
            self._torch_backend = self.make_torch_backend()
        return self._torch_backend

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
        info: dict[str, Any] = {"area": area, "noise_sha256": noise.record().get("sha256")}

        def python() -> ImageRun:
            return measured("python", self.backend, lambda backend: packaged.restore(self.rt, backend, video, noise, area))

        return CppBenchCase(f"{size}x{size}", "image", argv, python, self.torch_call(video, noise, area),
                            info, fresh_dir=out_dir)

    def torch_call(self, video: np.ndarray, noise: Any, area: int) -> Callable[[], ImageRun]:
        """The torch reference's ``restore`` on the same image and noise (the reference built
        before the clock starts)."""
        from ncnnport.models.seedvr2.pipeline import restore

        ref = self.ctx.loaded.reference

        def run() -> ImageRun:
            backend = self.torch_backend()
            return measured("torch", backend, lambda b: restore(ref.config, b, video, ref.text.numpy(), noise, area=area))
        return run


def cases(ctx: BenchContext, sizes: Sequence[int], torch_backend: Callable[[], Any],
          graph_backend_for: Callable[..., Any]) -> Iterator[CppBenchCase]:
    """One case per square image side, the package opened once. ``torch_backend`` builds the
    torch reference's backend (called only if a torch call runs); ``graph_backend_for`` (the
    port's; passed in, as to ``cpp_cases.cases``, since the port imports this file) builds the
    ncnn backend."""
    bench = SeedVR2Bench(ctx, torch_backend, graph_backend_for)
    for size in sizes:
        yield bench.case(int(size))
