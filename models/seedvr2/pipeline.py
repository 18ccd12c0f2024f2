"""One-step SeedVR2 restoration pipeline (spec section 3), split into host steps and a backend.

Host steps (resize, crop, frame padding, condition assembly, the Euler step, colour fix, uint8)
are shared by every backend; a :class:`Backend` supplies the three networks (VAE encoder, DiT,
VAE decoder). The PyTorch reference backend is here; the ncnn backend lives in ``runtime.py``.
Comparing the two with the same explicit noise isolates the converted graphs.
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ncnnport.models.seedvr2.config import OFFICIAL_SEED, SeedVR2Config
from ncnnport.models.seedvr2.dit import NaDiT, attention_dtype
from ncnnport.models.seedvr2.vae import VideoAutoencoderKL, latent_frames


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
    top, left = centre_offset(nh, ch), centre_offset(nw, cw)
    x = x[:, :, top:top + ch, left:left + cw]
    t = x.shape[0]
    pad = (-(t - 1)) % 4
    if pad:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)], dim=0)
    return (x * 2.0 - 1.0).permute(1, 0, 2, 3).contiguous().numpy()


def latent_shape_for(cfg: SeedVR2Config, video: np.ndarray, area: int, multiple: int = 16) -> tuple[int, int, int, int]:
    """(C, t, h, w) of the latent :func:`preprocess` + the encoder give for ``video`` at ``area``
    (what the noise must be drawn for), without resizing anything."""
    nh, nw = area_size(video.shape[1], video.shape[2], area)
    frames = video.shape[0] + (-(video.shape[0] - 1)) % 4
    s = cfg.vae.spatial_factor
    return (cfg.vae.latent_channels, latent_frames(frames, cfg.vae.temporal_factor),
            (nh - nh % multiple) // s, (nw - nw % multiple) // s)


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


def wavelet_color_fix(output: np.ndarray, source: np.ndarray,
                      content_dtype: torch.dtype = torch.float32) -> np.ndarray:
    """Per frame: high frequencies of the restored output + low frequencies of the input.

    Both are (3, T, H, W) in [-1, 1]; ``output`` is the decoder's UNCLIPPED output, as in the
    official script (it colour-fixes the VAE sample and clips afterwards). ``content_dtype`` is
    the dtype the output's decomposition runs in: the official sample is bfloat16 (the VAE runs
    in bf16), so its blur runs in bf16 while the input's stays float32; the sum is float32."""
    out = torch.from_numpy(output).to(content_dtype)
    src = torch.from_numpy(source)
    res = torch.empty(out.shape, dtype=torch.float32)
    for t in range(out.shape[1]):
        high, _ = wavelet_split(out[:, t])
        _, low = wavelet_split(src[:, t])
        res[:, t] = high.float() + low
    return res.numpy()


def to_uint8(x: np.ndarray) -> np.ndarray:
    """(3, T, H, W) -> uint8 (T, H, W, 3) with the official script's float32 arithmetic:
    ``clip(-1, 1) * 0.5 + 0.5``, ``* 255``, round half to even. Folding it into ``x * 127.5 +
    127.5`` rounds differently: about 5 in a million values land one level off."""
    y = np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0)
    y = (y * np.float32(0.5) + np.float32(0.5)) * np.float32(255.0)
    return np.rint(y).astype(np.uint8).transpose(1, 2, 3, 0)


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


class OfficialBackend:
    """The official script's numerics ("official-as-shipped"), on CPU.

    What projects/inference_seedvr2_3b.py runs: the VAE cast to bfloat16 (``vae.dtype``), the
    DiT under ``torch.autocast(bfloat16)`` with Q/K/V cast to bf16 before attention
    (dit_v2 mmattn: ``concat(...).bfloat16()`` into flash attention), host tensors (posterior
    sample, latents, Euler step, decoder output) held in bf16. Differences, by necessity: CPU
    autocast (the official is CUDA autocast; the op lists are close but not identical) and SDPA
    in place of flash-attention. A reported reference, never a gate: the fp32 port is judged
    against the fp32 reference."""

    host_dtype = torch.bfloat16

    def __init__(self, dit: NaDiT, vae: VideoAutoencoderKL) -> None:
        self.dit_model = dit.eval()
        self.vae = copy.deepcopy(vae).eval().to(torch.bfloat16)

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            m, lv = self.vae.encode_moments(torch.from_numpy(x).to(torch.bfloat16))
        return _f32(m), _f32(lv)

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16), \
                attention_dtype(self.dit_model, torch.bfloat16):
            out = self.dit_model.forward_stages(torch.from_numpy(cond), torch.from_numpy(txt), t)
        for k, v in out.items():
            stages[k] = _f32(v)
        return stages["velocity"]

    def decode(self, z: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return _f32(self.vae.decode(torch.from_numpy(z).to(torch.bfloat16)))


def host_round(backend: Any) -> Callable[[np.ndarray], np.ndarray]:
    """Rounds a host tensor to the backend's host dtype (identity for float32 backends)."""
    dtype = getattr(backend, "host_dtype", torch.float32)
    if dtype == torch.float32:
        return lambda a: a
    return lambda a: _f32(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(dtype))


# --- the one-step pipeline -------------------------------------------------------------------
# The official script's latents and noise are bfloat16: configs_3b/main.yaml sets vae.dtype, the
# encoder runs in it, and every draw is ``*_like`` a bf16 latent.
NOISE_DTYPE = torch.bfloat16


def _draw_posterior(shape: tuple[int, int, int, int], gen: torch.Generator) -> torch.Tensor:
    """diffusers' ``DiagonalGaussianDistribution.sample``: ``randn_tensor(mean.shape)`` over the
    encoder's (1, C, t, h, w) mean, contiguous, in the VAE dtype."""
    return torch.randn((1, *shape), generator=gen, device=gen.device, dtype=NOISE_DTYPE)[0]


def _draw_like_latent(shape: tuple[int, int, int, int], gen: torch.Generator) -> torch.Tensor:
    """``torch.randn_like(latent)`` on the official latent: a ``b c t h w -> b t h w c`` VIEW of
    the encoder output, so the draw fills memory in channel-first order. Returned as (C, t, h, w)."""
    channels_last = torch.empty((1, *shape), device=gen.device, dtype=NOISE_DTYPE).permute(0, 2, 3, 4, 1)[0]
    return channels_last.normal_(generator=gen).permute(3, 0, 1, 2)


@dataclass
class Noise:
    """Explicit randomness: posterior noise and x_T, both channel-first (16, t, h, w) like the
    official draws. ``posterior=None`` uses the posterior mean. ``seed``/``device`` say where a
    seeded draw came from (None for noise given by the caller)."""

    x_T: np.ndarray
    posterior: np.ndarray | None = None
    seed: int | None = None
    device: str | None = None

    @staticmethod
    def seeded(latent_shape: tuple[int, int, int, int], seed: int, sample_posterior: bool = True,
               device: str = "cpu") -> "Noise":
        """The official script's draws for one clip: same order, shapes, layout and dtype.

        Official order (projects/inference_seedvr2_3b.py): ``set_seed(seed)`` (torch.manual_seed,
        which seeds the CPU and every CUDA generator), then ``vae_encode`` samples the posterior
        (``mean + std * randn``, bf16 on the GPU), then ``generation_step`` draws
        ``noises = [randn_like(latent) ...]`` (x_T) and ``aug_noises`` (unused at
        ``cond_noise_scale = 0``, drawn after x_T, so not drawn here) -- one clip per call, so the
        per-sample list order reduces to posterior noise, then x_T.

        The official draws run on CUDA (the frames are moved to ``get_device()`` before
        encoding) with the default CUDA generator (Philox). ``device="cuda"`` draws with a CUDA
        generator seeded the same way: the same values as the official run on the same GPU model
        and PyTorch (the CUDA normal kernel assigns Philox subsequences per thread, and its grid
        depends on the GPU's SM count, so other GPUs may differ). ``device="cpu"`` (default, no GPU
        needed) uses torch's CPU generator (mt19937): same order, shapes, layout and dtype, and
        standard-normal statistics, but NOT the official values -- CPU and CUDA generators share
        no stream, and no CPU torch call reproduces the CUDA one. Values are bf16, stored as
        float32 (exactly)."""
        gen = torch.Generator(device=device).manual_seed(seed)
        post = _draw_posterior(latent_shape, gen) if sample_posterior else None
        x_T = _draw_like_latent(latent_shape, gen)
        return Noise(x_T=_f32(x_T), posterior=None if post is None else _f32(post), seed=seed, device=device)

    def record(self) -> dict[str, Any]:
        """What a parity record or run log keeps to identify the noise: shape, seed, device and a
        sha256 over the float32 bytes of x_T then the posterior noise."""
        h = hashlib.sha256(np.ascontiguousarray(self.x_T, dtype=np.float32).tobytes())
        if self.posterior is not None:
            h.update(np.ascontiguousarray(self.posterior, dtype=np.float32).tobytes())
        return {"shape": list(self.x_T.shape), "seed": self.seed, "device": self.device,
                "dtype": "bfloat16" if self.seed is not None else str(self.x_T.dtype),
                "posterior": "sample" if self.posterior is not None else "mean", "sha256": h.hexdigest()}


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.float().cpu().numpy())


def posterior_latent(mean: np.ndarray, logvar: np.ndarray, noise: Noise, scale: float) -> np.ndarray:
    """(1, C, t, h, w) moments -> scaled latent (C, t, h, w): ``(mean + exp(logvar / 2) * eps) *
    scale``, or ``mean * scale`` when the noise carries no posterior draw."""
    z = mean[0]
    if noise.posterior is not None:
        if noise.posterior.shape != z.shape:
            raise ValueError(f"posterior noise {noise.posterior.shape}, posterior is {z.shape}")
        z = z + np.exp(0.5 * logvar[0]) * noise.posterior
    return (z * scale).astype(np.float32)


@dataclass
class Result:
    frames: np.ndarray                       # uint8 (T, H, W, 3), padding frames removed
    stages: dict[str, np.ndarray] = field(default_factory=dict)
    noise: Noise | None = None


def restore(cfg: SeedVR2Config, backend: Backend, video: np.ndarray, txt: np.ndarray,
            noise: Noise | None = None, *, seed: int = OFFICIAL_SEED, area: int | None = None,
            colour_fix: bool = True, sample_posterior: bool = True) -> Result:
    """uint8 frames (T, H, W, 3) -> restored uint8 frames, with every intermediate recorded.

    ``area`` defaults to the input's own area (no resize): the real model is run at 720x1280.
    Without explicit ``noise`` the official draws for ``seed`` are made (:meth:`Noise.seeded`),
    sampling the posterior like the official encoder unless ``sample_posterior`` is False.
    """
    n_in = video.shape[0]
    rnd = host_round(backend)
    area = area if area is not None else video.shape[1] * video.shape[2]
    x = preprocess(video, area)                                    # (3, T, H, W)
    stages: dict[str, np.ndarray] = {"input": x}
    c, T, H, W = x.shape
    s = cfg.vae.spatial_factor
    lat_shape = (cfg.vae.latent_channels, latent_frames(T, cfg.vae.temporal_factor), H // s, W // s)
    noise = noise if noise is not None else Noise.seeded(lat_shape, seed, sample_posterior)
    if noise.x_T.shape != lat_shape:
        raise ValueError(f"x_T noise {noise.x_T.shape}, latent is {lat_shape}")
    mean, logvar = backend.encode(x[None])
    stages["posterior_mean"], stages["posterior_logvar"] = mean, logvar
    latent = rnd(posterior_latent(mean, logvar, noise, cfg.vae.scaling_factor))   # (16, t, h, w)
    stages["latent"] = latent
    lq = latent.transpose(1, 2, 3, 0)                              # channels-last
    x_T = noise.x_T.transpose(1, 2, 3, 0)
    mask = np.ones(lq.shape[:3] + (1,), dtype=np.float32)
    cond = np.ascontiguousarray(np.concatenate([x_T, lq, mask], axis=-1), dtype=np.float32)
    v = backend.dit(cond, np.ascontiguousarray(txt, dtype=np.float32), cfg.timestep, stages)
    # Linear-interpolation schedule, velocity prediction, one Euler step from t = T to 0.
    x0 = rnd((x_T - v * (cfg.timestep / cfg.schedule_T)).astype(np.float32))
    stages["x0"] = x0
    z = rnd(np.ascontiguousarray((x0 / cfg.vae.scaling_factor).transpose(3, 0, 1, 2)[None], dtype=np.float32))
    dec = backend.decode(z)[0]            # unclipped: the official colour-fixes, then clips
    stages["decoded"] = dec
    if colour_fix:
        dec = wavelet_color_fix(dec, x, getattr(backend, "host_dtype", torch.float32))
    frames = to_uint8(dec)[:n_in]
    stages["frames"] = frames
    return Result(frames=frames, stages=stages, noise=noise)
