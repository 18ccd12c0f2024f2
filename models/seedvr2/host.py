"""The one-step SeedVR2 host flow without torch (spec section 3): resize, centre crop, frame
padding, posterior latent, condition assembly, the Euler step, colour fix and uint8.

Why its own module: ``run --package`` and ``verify`` must not import torch, yet they have to
run the exact flow of the torch run path. ``pipeline.restore`` is this :func:`restore` with the
torch host ops plugged in (ATen's resize, the bf16-aware colour fix, the official seeded draws,
host rounding); the packaged runtime plugs in the numpy ones (``host_numpy``). Every step here
is float32 numpy arithmetic in the order the torch path used, so both give the same bytes where
their plugged ops do.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from ncnnport.models.seedvr2 import host_numpy

# (T, 3, H, W) float32, height, width -> resized (T, 3, height, width) float32
Resize = Callable[[np.ndarray, int, int], np.ndarray]
# (decoded (3, T, H, W), preprocessed input (3, T, H, W)) -> colour-fixed (3, T, H, W)
ColourFix = Callable[[np.ndarray, np.ndarray], np.ndarray]


def latent_frames(frames: int, temporal_factor: int = 4) -> int:
    """4n+1 video frames -> n+1 latent frames (only 4n+1 is valid)."""
    if frames < 1 or (frames - 1) % temporal_factor:
        raise ValueError(f"{frames} frames: the causal VAE needs {temporal_factor}n+1 frames")
    return (frames - 1) // temporal_factor + 1


# --- preprocessing ---------------------------------------------------------------------------
def area_size(h: int, w: int, area: int) -> tuple[int, int]:
    """Size with the aspect ratio of (h, w) and about ``area`` pixels (upscaling allowed)."""
    scale = math.sqrt(area / (h * w))
    return max(1, round(h * scale)), max(1, round(w * scale))


def centre_offset(size: int, crop: int) -> int:
    """First kept row/column of a centre crop from ``size`` to ``crop``.

    The official DivisibleCrop calls torchvision's ``center_crop``, whose offset is
    ``int(round((size - crop) / 2.0))``: Python's round, half to even, so an odd margin of 3, 7,
    11 or 15 px starts one pixel later than a floor division would (2, 4, 6, 8 instead of 1, 3,
    5, 7) and margins 1, 5, 9, 13 start where floor puts them."""
    return int(round((size - crop) / 2.0))


def numpy_resize(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """The torch-free antialiased bicubic resize (ATen's bytes when upscaling, within 2 float32
    ulp when downscaling)."""
    return host_numpy.resize_bicubic_aa(x, height, width)


def preprocess(frames: np.ndarray, area: int, multiple: int = 16, resize: Resize = numpy_resize) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float32 (3, T', H', W') in [-1, 1].

    Area resize (bicubic, antialiased, clamped to [0, 1]), CENTRE crop to a multiple of 16, and
    frames padded to 4n+1 by repeating the last frame (the causal VAE needs 4n+1). ``resize``
    gets a (T, 3, H, W) view of channels-last memory, as the torch path always passed it.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 (T, H, W, 3) frames, got {frames.dtype} {frames.shape}")
    x = (np.ascontiguousarray(frames).astype(np.float32) / np.float32(255.0)).transpose(0, 3, 1, 2)
    nh, nw = area_size(x.shape[2], x.shape[3], area)
    if (nh, nw) != tuple(x.shape[2:]):
        x = np.asarray(resize(x, nh, nw), np.float32)
    x = np.clip(x, np.float32(0.0), np.float32(1.0))
    ch, cw = nh - nh % multiple, nw - nw % multiple
    if ch == 0 or cw == 0:
        raise ValueError(f"resized frame {nh}x{nw} is smaller than {multiple} px")
    top, left = centre_offset(nh, ch), centre_offset(nw, cw)
    x = x[:, :, top:top + ch, left:left + cw]
    pad = (-(x.shape[0] - 1)) % 4
    if pad:
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)
    y = x * np.float32(2.0) - np.float32(1.0)
    return np.ascontiguousarray(y.transpose(1, 0, 2, 3), dtype=np.float32)


def latent_shape_for(cfg: Any, video: np.ndarray, area: int, multiple: int = 16) -> tuple[int, int, int, int]:
    """(C, t, h, w) of the latent :func:`preprocess` + the encoder give for ``video`` at ``area``
    (what the noise must be drawn for), without resizing anything."""
    nh, nw = area_size(video.shape[1], video.shape[2], area)
    frames = video.shape[0] + (-(video.shape[0] - 1)) % 4
    s = cfg.vae.spatial_factor
    return (cfg.vae.latent_channels, latent_frames(frames, cfg.vae.temporal_factor),
            (nh - nh % multiple) // s, (nw - nw % multiple) // s)


def to_uint8(x: np.ndarray) -> np.ndarray:
    """(3, T, H, W) -> uint8 (T, H, W, 3) with the official script's float32 arithmetic:
    ``clip(-1, 1) * 0.5 + 0.5``, ``* 255``, round half to even. Folding it into ``x * 127.5 +
    127.5`` rounds differently: about 5 in a million values land one level off."""
    y = np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0)
    y = (y * np.float32(0.5) + np.float32(0.5)) * np.float32(255.0)
    return np.rint(y).astype(np.uint8).transpose(1, 2, 3, 0)


# --- noise -----------------------------------------------------------------------------------
@dataclass
class Noise:
    """Explicit randomness: posterior noise and x_T, both channel-first (16, t, h, w) like the
    official draws. ``posterior=None`` uses the posterior mean. ``seed``/``device`` say where a
    seeded draw came from (None for noise given by the caller; device ``numpy`` for
    :func:`numpy_noise`). The official torch draws are ``pipeline.Noise.seeded``."""

    x_T: np.ndarray
    posterior: np.ndarray | None = None
    seed: int | None = None
    device: str | None = None

    def record(self) -> dict[str, Any]:
        """What a parity record or run log keeps to identify the noise: shape, seed, device and a
        sha256 over the float32 bytes of x_T then the posterior noise."""
        h = hashlib.sha256(np.ascontiguousarray(self.x_T, dtype=np.float32).tobytes())
        if self.posterior is not None:
            h.update(np.ascontiguousarray(self.posterior, dtype=np.float32).tobytes())
        return {"shape": list(self.x_T.shape), "seed": self.seed, "device": self.device,
                "dtype": "bfloat16" if self.seed is not None else str(self.x_T.dtype),
                "posterior": "sample" if self.posterior is not None else "mean", "sha256": h.hexdigest()}


NOISE_KEYS = ("x_T", "posterior")


def read_noise(path: Any, shape: tuple[int, ...] | None = None) -> Noise:
    """``--noise FILE.npz`` / a case's ``noise.npz``: float32 ``x_T`` and optionally ``posterior``
    (channel-first, as the official draws), read without pickle; problems are one ValueError
    naming the file."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable .npz of numeric arrays ({exc})") from None
    unknown = sorted(set(arrays) - set(NOISE_KEYS))
    if "x_T" not in arrays or unknown:
        raise ValueError(f"{path}: needs array 'x_T' (and optionally 'posterior'), has {sorted(arrays)}")
    for k, a in arrays.items():
        if a.dtype != np.float32:
            raise ValueError(f"{path}: array {k!r} is {a.dtype}, expected float32")
        if shape is not None and tuple(a.shape) != tuple(shape):
            raise ValueError(f"{path}: array {k!r} has shape {list(a.shape)}, this input's latent is {list(shape)}")
    return Noise(x_T=arrays["x_T"], posterior=arrays.get("posterior"))


def numpy_noise(shape: tuple[int, int, int, int], seed: int, sample_posterior: bool = True) -> Noise:
    """Noise for a run without torch: numpy's PCG64 standard normals for ``seed`` in the
    official order (posterior, then x_T), rounded to bf16 like the official draws. NOT the
    official values: torch's generator is another stream (the caller says so)."""
    rng = np.random.default_rng(seed)
    post = host_numpy.bf16_round(rng.standard_normal(shape, dtype=np.float32)) if sample_posterior else None
    x_T = host_numpy.bf16_round(rng.standard_normal(shape, dtype=np.float32))
    return Noise(x_T=x_T, posterior=post, seed=seed, device="numpy")


def posterior_latent(mean: np.ndarray, logvar: np.ndarray, noise: Noise, scale: float) -> np.ndarray:
    """(1, C, t, h, w) moments -> scaled latent (C, t, h, w): ``(mean + exp(logvar / 2) * eps) *
    scale``, or ``mean * scale`` when the noise carries no posterior draw."""
    z = mean[0]
    if noise.posterior is not None:
        if noise.posterior.shape != z.shape:
            raise ValueError(f"posterior noise {noise.posterior.shape}, posterior is {z.shape}")
        z = z + np.exp(0.5 * logvar[0]) * noise.posterior
    return (z * scale).astype(np.float32)


# --- the one-step flow -----------------------------------------------------------------------
class Backend(Protocol):
    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(1, 3, T, H, W) -> posterior (mean, logvar), each (1, 16, t, h, w)."""

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        """(t, h, w, 33), (L, txt_in) -> velocity (t, h, w, 16); records intermediates."""

    def decode(self, z: np.ndarray) -> np.ndarray:
        """(1, 16, t, h, w) -> (1, 3, T, H, W)."""


STAGES = ("encode", "dit", "decode")


def stage_done(backend: Any, stage: str) -> None:
    """Tell ``backend`` that ``stage`` (one of :data:`STAGES`) will not be called again in this
    restore, after all its calls (every tile of a tiled VAE): a backend that frees memory per
    stage (``runner.GraphBackend`` under ``--low-memory``) closes that stage's graphs; others
    need not implement it."""
    done = getattr(backend, "stage_done", None)
    if done is not None:
        done(stage)


@dataclass
class Result:
    frames: np.ndarray                       # uint8 (T, H, W, 3), padding frames removed
    stages: dict[str, np.ndarray] = field(default_factory=dict)
    noise: Noise | None = None


@dataclass(frozen=True)
class HostOps:
    """The host steps a flow plugs in: ``resize`` (preprocessing), ``colour_fix`` and ``rnd``
    (rounds a host tensor to the backend's host dtype; identity in float32)."""

    resize: Resize = numpy_resize
    colour_fix: ColourFix = host_numpy.wavelet_color_fix
    rnd: Callable[[np.ndarray], np.ndarray] = lambda a: a


def restore(cfg: Any, backend: Backend, video: np.ndarray, txt: np.ndarray, noise: Noise, *, area: int,
            colour_fix: bool = True, ops: HostOps = HostOps()) -> Result:
    """uint8 frames (T, H, W, 3) -> restored uint8 frames with explicit ``noise``, every
    intermediate recorded in ``Result.stages``."""
    n_in = video.shape[0]
    rnd = ops.rnd
    x = preprocess(video, area, resize=ops.resize)                 # (3, T, H, W)
    stages: dict[str, np.ndarray] = {"input": x}
    c, T, H, W = x.shape
    s = cfg.vae.spatial_factor
    lat_shape = (cfg.vae.latent_channels, latent_frames(T, cfg.vae.temporal_factor), H // s, W // s)
    if noise.x_T.shape != lat_shape:
        raise ValueError(f"x_T noise {noise.x_T.shape}, latent is {lat_shape}")
    mean, logvar = backend.encode(x[None])
    stage_done(backend, "encode")
    stages["posterior_mean"], stages["posterior_logvar"] = mean, logvar
    latent = rnd(posterior_latent(mean, logvar, noise, cfg.vae.scaling_factor))   # (16, t, h, w)
    stages["latent"] = latent
    lq = latent.transpose(1, 2, 3, 0)                              # channels-last
    x_T = noise.x_T.transpose(1, 2, 3, 0)
    mask = np.ones(lq.shape[:3] + (1,), dtype=np.float32)
    cond = np.ascontiguousarray(np.concatenate([x_T, lq, mask], axis=-1), dtype=np.float32)
    v = backend.dit(cond, np.ascontiguousarray(txt, dtype=np.float32), cfg.timestep, stages)
    stage_done(backend, "dit")
    # Linear-interpolation schedule, velocity prediction, one Euler step from t = T to 0.
    x0 = rnd((x_T - v * (cfg.timestep / cfg.schedule_T)).astype(np.float32))
    stages["x0"] = x0
    z = rnd(np.ascontiguousarray((x0 / cfg.vae.scaling_factor).transpose(3, 0, 1, 2)[None], dtype=np.float32))
    dec = backend.decode(z)[0]            # unclipped: the official colour-fixes, then clips
    stage_done(backend, "decode")
    stages["decoded"] = dec
    if colour_fix:
        dec = ops.colour_fix(dec, x)
    frames = to_uint8(dec)[:n_in]
    stages["frames"] = frames
    return Result(frames=frames, stages=stages, noise=noise)
