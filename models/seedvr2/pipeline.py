"""One-step SeedVR2 restoration pipeline (spec section 3), split into host steps and a backend.

Host steps (resize, crop, frame padding, condition assembly, the Euler step, colour fix, uint8)
are shared by every backend; a :class:`Backend` supplies the three networks (VAE encoder, DiT,
VAE decoder). The PyTorch reference backend is here; the ncnn backend lives in ``runtime.py``.
Comparing the two with the same explicit noise isolates the converted graphs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ncnnport.models.seedvr2.config import SeedVR2Config
from ncnnport.models.seedvr2.dit import NaDiT
from ncnnport.models.seedvr2.vae import VideoAutoencoderKL, latent_frames


# --- preprocessing ---------------------------------------------------------------------------
def area_size(h: int, w: int, area: int) -> tuple[int, int]:
    """Size with the aspect ratio of (h, w) and about ``area`` pixels (upscaling allowed)."""
    scale = math.sqrt(area / (h * w))
    return max(1, round(h * scale)), max(1, round(w * scale))


def preprocess(frames: np.ndarray, area: int, multiple: int = 16) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float32 (3, T', H', W') in [-1, 1].

    Area resize (bicubic, antialiased, clamped to [0, 1]), CENTRE crop to a multiple of 16, and
    frames padded to 4n+1 by repeating the last frame (the causal VAE needs 4n+1).
    """
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"expected uint8 (T, H, W, 3) frames, got {frames.dtype} {frames.shape}")
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 255.0
    nh, nw = area_size(x.shape[2], x.shape[3], area)
    if (nh, nw) != tuple(x.shape[2:]):
        x = F.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)
    x = x.clamp(0.0, 1.0)
    ch, cw = nh - nh % multiple, nw - nw % multiple
    if ch == 0 or cw == 0:
        raise ValueError(f"resized frame {nh}x{nw} is smaller than {multiple} px")
    top, left = (nh - ch) // 2, (nw - cw) // 2
    x = x[:, :, top:top + ch, left:left + cw]
    t = x.shape[0]
    pad = (-(t - 1)) % 4
    if pad:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)], dim=0)
    return (x * 2.0 - 1.0).permute(1, 0, 2, 3).contiguous().numpy()


# --- colour fix ------------------------------------------------------------------------------
def wavelet_blur(x: torch.Tensor, radius: int) -> torch.Tensor:
    """Dilated 3x3 binomial blur with replicate padding; x is (C, H, W)."""
    k = torch.tensor([[1, 2, 1], [2, 4, 2], [1, 2, 1]], dtype=x.dtype) / 16.0
    c = x.shape[0]
    xp = F.pad(x[None], (radius, radius, radius, radius), mode="replicate")
    return F.conv2d(xp, k.expand(c, 1, 3, 3), groups=c, dilation=radius)[0]


def wavelet_split(x: torch.Tensor, levels: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) frequency parts: 5 levels of blur with radius 2^i."""
    high = torch.zeros_like(x)
    low = x
    for i in range(levels):
        blurred = wavelet_blur(low, 2 ** i)
        high = high + (low - blurred)
        low = blurred
    return high, low


def wavelet_color_fix(output: np.ndarray, source: np.ndarray) -> np.ndarray:
    """Per frame: high frequencies of the restored output + low frequencies of the input.

    Both are (3, T, H, W) in [-1, 1]."""
    out = torch.from_numpy(output)
    src = torch.from_numpy(source)
    res = torch.empty_like(out)
    for t in range(out.shape[1]):
        high, _ = wavelet_split(out[:, t])
        _, low = wavelet_split(src[:, t])
        res[:, t] = high + low
    return res.numpy()


def to_uint8(x: np.ndarray) -> np.ndarray:
    """(3, T, H, W) in [-1, 1] -> uint8 (T, H, W, 3): clip, *127.5 + 127.5, round."""
    y = np.clip(x, -1.0, 1.0) * 127.5 + 127.5
    return np.clip(np.rint(y), 0, 255).astype(np.uint8).transpose(1, 2, 3, 0)


# --- backends --------------------------------------------------------------------------------
class Backend(Protocol):
    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(1, 3, T, H, W) -> posterior (mean, logvar), each (1, 16, t, h, w)."""

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        """(t, h, w, 33), (L, txt_in) -> velocity (t, h, w, 16); records intermediates."""

    def decode(self, z: np.ndarray) -> np.ndarray:
        """(1, 16, t, h, w) -> (1, 3, T, H, W)."""


class TorchBackend:
    """The fp32 PyTorch reference."""

    def __init__(self, dit: NaDiT, vae: VideoAutoencoderKL) -> None:
        self.dit_model, self.vae = dit.eval(), vae.eval()

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            m, lv = self.vae.encode_moments(torch.from_numpy(x))
        return m.numpy(), lv.numpy()

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = self.dit_model.forward_stages(torch.from_numpy(cond), torch.from_numpy(txt), t)
        for k, v in out.items():
            stages[k] = v.numpy()
        return out["velocity"].numpy()

    def decode(self, z: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.vae.decode(torch.from_numpy(z)).numpy()


# --- the one-step pipeline -------------------------------------------------------------------
@dataclass
class Noise:
    """Explicit randomness: posterior noise and x_T, both channel-first (16, t, h, w) like the
    official randn_like on a permuted view. ``posterior=None`` uses the posterior mean."""

    x_T: np.ndarray
    posterior: np.ndarray | None = None

    @staticmethod
    def seeded(latent_shape: tuple[int, int, int, int], seed: int, sample_posterior: bool = False) -> "Noise":
        g = torch.Generator().manual_seed(seed)
        post = torch.randn(latent_shape, generator=g).numpy() if sample_posterior else None
        x_T = torch.randn(latent_shape, generator=g).numpy()
        return Noise(x_T=x_T, posterior=post)


@dataclass
class Result:
    frames: np.ndarray                       # uint8 (T, H, W, 3), padding frames removed
    stages: dict[str, np.ndarray] = field(default_factory=dict)


def restore(cfg: SeedVR2Config, backend: Backend, video: np.ndarray, txt: np.ndarray,
            noise: Noise | None = None, *, seed: int = 0, area: int | None = None,
            colour_fix: bool = True) -> Result:
    """uint8 frames (T, H, W, 3) -> restored uint8 frames, with every intermediate recorded.

    ``area`` defaults to the input's own area (no resize): the real model is run at 720x1280.
    """
    n_in = video.shape[0]
    area = area if area is not None else video.shape[1] * video.shape[2]
    x = preprocess(video, area)                                    # (3, T, H, W)
    stages: dict[str, np.ndarray] = {"input": x}
    c, T, H, W = x.shape
    s = cfg.vae.spatial_factor
    lat_shape = (cfg.vae.latent_channels, latent_frames(T, cfg.vae.temporal_factor), H // s, W // s)
    noise = noise if noise is not None else Noise.seeded(lat_shape, seed)
    if noise.x_T.shape != lat_shape:
        raise ValueError(f"x_T noise {noise.x_T.shape}, latent is {lat_shape}")
    mean, logvar = backend.encode(x[None])
    stages["posterior_mean"], stages["posterior_logvar"] = mean, logvar
    z = mean[0]
    if noise.posterior is not None:
        z = z + np.exp(0.5 * logvar[0]) * noise.posterior
    latent = (z * cfg.vae.scaling_factor).astype(np.float32)       # (16, t, h, w)
    stages["latent"] = latent
    lq = latent.transpose(1, 2, 3, 0)                              # channels-last
    x_T = noise.x_T.transpose(1, 2, 3, 0)
    mask = np.ones(lq.shape[:3] + (1,), dtype=np.float32)
    cond = np.ascontiguousarray(np.concatenate([x_T, lq, mask], axis=-1), dtype=np.float32)
    v = backend.dit(cond, np.ascontiguousarray(txt, dtype=np.float32), cfg.timestep, stages)
    # Linear-interpolation schedule, velocity prediction, one Euler step from t = T to 0.
    x0 = (x_T - v * (cfg.timestep / cfg.schedule_T)).astype(np.float32)
    stages["x0"] = x0
    z = np.ascontiguousarray((x0 / cfg.vae.scaling_factor).transpose(3, 0, 1, 2)[None], dtype=np.float32)
    dec = np.clip(backend.decode(z)[0], -1.0, 1.0)
    stages["decoded"] = dec
    if colour_fix:
        dec = wavelet_color_fix(dec, x)
    frames = to_uint8(dec)[:n_in]
    stages["frames"] = frames
    return Result(frames=frames, stages=stages)
