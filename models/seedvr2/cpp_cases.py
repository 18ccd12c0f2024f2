"""SeedVR2's cases for ``parity --runtime cpp``: each e2e fixture (and ``--input`` file or folder)
as PNG frames + its noise ``.npz`` for ``ncnnport-seedvr2``, run beforehand on the torch-free
Python package loop (``packaged.restore``, numpy host ops) and on the torch reference.

Why explicit noise: the official draws are torch's generator, which the C++ executable does not
reproduce, so the fixture's draws (``pipeline.Noise.seeded`` with the fixture's seed, as
``e2e_parity`` draws them) are written as ``noise.npz`` and all three runs use the same values.
Why PNG frames: the executable reads image files only; PNG is lossless, so the C++ and Python
loops start from the same bytes. A user input the executable decodes itself (PNG, JPEG) is passed
as it is; other formats and frame folders are decoded once (as ``run`` does) and written as PNG.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ncnnport.registry import CppCase, E2EContext

# the formats ncnnport-seedvr2 decodes itself (runtime/cpp/src/image_io.cpp)
CPP_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
USER_INPUT_SEED = 100  # e2e_parity draws user input i with seed 100 + i


def write_png_frames(video: np.ndarray, dest: Path) -> Path:
    """uint8 (T, H, W, 3) -> ``dest.png`` (one frame) or ``dest/frame_00000.png``... (a folder,
    name order = frame order, as the executable reads a folder)."""
    from PIL import Image

    if video.shape[0] == 1:
        path = dest.with_suffix(".png")
        Image.fromarray(video[0]).save(path)
        return path
    dest.mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(video):
        Image.fromarray(frame).save(dest / f"frame_{i:05d}.png")
    return dest


def write_noise(noise: Any, path: Path) -> Path:
    """The fixture's draws as the executable's ``--noise`` file (uncompressed float32 npz)."""
    from ncnnport.models.seedvr2.describe import noise_npz

    path.write_bytes(noise_npz(noise.x_T, noise.posterior))
    return path


def inputs(fixtures: Sequence[Any], users: Sequence[tuple[Path, np.ndarray, int]],
           workdir: Path) -> list[tuple[str, np.ndarray, Path, int, int]]:
    """(fixture, uint8 video, the file or folder the executable reads, seed, area): every synthetic
    fixture at its own size (as ``e2e_parity``), written as PNG; every user input (path, decoded
    video, working area) with seed 100 + i, passed as it is when the executable decodes that file
    itself (PNG, JPEG), else written as PNG frames."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = []
    for fx in fixtures:
        video = fx.video()
        out.append((fx.label, video, write_png_frames(video, workdir / fx.label), fx.seed, fx.height * fx.width))
    for i, (path, video, area) in enumerate(users):
        own = path.is_file() and path.suffix.lower() in CPP_IMAGE_SUFFIXES
        out.append((f"input:{path.name}", video, path if own else write_png_frames(video, workdir / f"input{i}"),
                    USER_INPUT_SEED + i, area))
    return out


def executable_argv(package: Path, image: Path, noise: Path, area: int, out_dir: Path) -> list[str]:
    """The executable's arguments for one input (everything but ``--json-out``)."""
    return ["--package", str(Path(package).resolve()), "--input", str(image), "--output", str(out_dir),
            "--noise", str(noise), "--area", str(area)]


def cases(ctx: E2EContext, workdir: Path, fixtures: Sequence[Any], users: Sequence[tuple[Path, np.ndarray, int]],
          torch_backend: Any, backend_for: Callable[..., Any]) -> list[CppCase]:
    """Every input (see :func:`inputs`) run on the package loop over ``ctx.ncnn_modules``
    (``backend_for(cfg, modules, trig=...)``: the frames the C++ must equal) and on the torch
    reference (``torch_backend``: frames judged by the frames gate)."""
    from ncnnport.fsutil import read_json
    from ncnnport.models.seedvr2 import packaged
    from ncnnport.models.seedvr2.host import latent_shape_for
    from ncnnport.models.seedvr2.pipeline import Noise, restore

    package = Path(ctx.package_dir)
    rt = packaged.open_packaged(package, read_json(package / "model.json"))
    backend, _ = backend_for(rt.cfg, ctx.ncnn_modules, trig=rt.trig)
    ref = ctx.loaded.reference
    gate = ctx.policy.stage("frames", "fp32")
    out = []
    for name, video, path, seed, area in inputs(fixtures, users, workdir):
        noise = Noise.seeded(latent_shape_for(rt.cfg, video, area), seed)
        slug = name.replace(":", "_").replace("/", "_")
        noise_file = write_noise(noise, workdir / f"{slug}.noise.npz")
        ours = packaged.restore(rt, backend, video, noise, area)
        theirs = restore(ref.config, torch_backend, video, ref.text.numpy(), noise, area=area)
        out.append(CppCase(fixture=name, argv=executable_argv(package, path, noise_file, area, workdir / f"{slug}.out"),
                           python_tokens=[], reference_tokens=[], python_frames=ours.frames,
                           reference_frames=theirs.frames, frames_gate=gate))
    return out


def package_argv(package: Path, case: Any, workdir: Path) -> list[str]:
    """A packaged case (``cases/<name>/``: ``input.png``, ``noise.npz``, ``area``, ``colour_fix``)
    as the executable's arguments, frames written under ``workdir``."""
    argv = executable_argv(package, case.inputs["frames"], case.inputs["noise"], int(case.args["area"]),
                           Path(workdir) / "frames")
    return argv if case.args.get("colour_fix", True) else argv + ["--no-colour-fix"]
