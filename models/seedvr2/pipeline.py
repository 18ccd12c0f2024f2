"""One-step SeedVR2 restoration pipeline (spec section 3), split into host steps and a backend.

Host steps (resize, crop, frame padding, condition assembly, the Euler step, colour fix, uint8)
are shared by every backend (the torch-free flow is ``host.py``; this module plugs in the torch
host ops: ATen's resize, the bf16-aware colour fix, the official seeded draws); a
:class:`Backend` supplies the three networks (VAE encoder, DiT, VAE decoder). The PyTorch
reference backends are here; the graph backend lives in ``runner.py``. Comparing the two with
the same explicit noise isolates the converted graphs.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ncnnport.models.seedvr2.config import OFFICIAL_SEED, SeedVR2Config
from ncnnport.models.seedvr2.dit import NaDiT, attention_dtype
from ncnnport.models.seedvr2 import host
from ncnnport.models.seedvr2.host import (Backend, HostOps, Result, area_size, centre_offset,  # noqa: F401 (re-exported)
                                          latent_shape_for, posterior_latent, to_uint8)
from ncnnport.models.seedvr2.vae import VideoAutoencoderKL


# --- preprocessing ---------------------------------------------------------------------------
def torch_resize(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """ATen's antialiased bicubic (``F.interpolate(mode="bicubic", antialias=True)``) on the
    (T, 3, H, W) array as given (strides kept: the run path always passed a channels-last view)."""
    return F.interpolate(torch.from_numpy(x), size=(height, width), mode="bicubic", align_corners=False,
                         antialias=True).numpy()


def preprocess(frames: np.ndarray, area: int, multiple: int = 16) -> np.ndarray:
    """``host.preprocess`` with ATen's resize: uint8 (T, H, W, 3) -> float32 (3, T', H', W')."""
    return host.preprocess(frames, area, multiple, resize=torch_resize)


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


# --- backends --------------------------------------------------------------------------------
class TorchBackend:
    """The fp32 PyTorch reference, on ``device`` (default the CPU).

    The pipeline around it is numpy on the host, so every call takes numpy in and gives numpy
    out: on the CPU the tensors share the arrays' memory (no copy, the parity reference's bytes);
    on another device the inputs are copied there, and the outputs copied back after the device
    has finished (``synchronize``), so a timer around a call measures the device's work. The
    modules are moved to ``device`` in place when the backend is built (bench-cpp builds it at
    its first torch call); TF32 is turned off there so a CUDA run is true fp32."""

    def __init__(self, dit: NaDiT, vae: VideoAutoencoderKL, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.dit_model, self.vae = dit.eval().to(self.device), vae.eval().to(self.device)

    def _in(self, a: np.ndarray) -> torch.Tensor:
        """A numpy input as a tensor on the device (a view of ``a`` on the CPU)."""
        return torch.from_numpy(a).to(self.device)

    def synchronize(self) -> None:
        """Wait for the device's queued work (nothing to wait for on the CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _out(self, t: torch.Tensor) -> np.ndarray:
        """An output as numpy, after the device has finished computing it."""
        if self.device.type == "cpu":
            return t.numpy()
        self.synchronize()
        return t.cpu().numpy()

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            m, lv = self.vae.encode_moments(self._in(x))
        return self._out(m), self._out(lv)

    def dit(self, cond: np.ndarray, txt: np.ndarray, t: float, stages: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = self.dit_model.forward_stages(self._in(cond), self._in(txt), t)
        for k, v in out.items():
            stages[k] = self._out(v)
        return stages["velocity"]

    def decode(self, z: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self._out(self.vae.decode(self._in(z)))


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


class Noise(host.Noise):
    """``host.Noise`` with the official torch draws (:meth:`seeded`)."""

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


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.float().cpu().numpy())


def restore(cfg: SeedVR2Config, backend: Backend, video: np.ndarray, txt: np.ndarray,
            noise: host.Noise | None = None, *, seed: int = OFFICIAL_SEED, area: int | None = None,
            colour_fix: bool = True, sample_posterior: bool = True) -> Result:
    """uint8 frames (T, H, W, 3) -> restored uint8 frames, with every intermediate recorded.

    ``host.restore`` with the torch host ops. ``area`` defaults to the input's own area (no
    resize): the real model is run at 720x1280. Without explicit ``noise`` the official draws for
    ``seed`` are made (:meth:`Noise.seeded`), sampling the posterior like the official encoder
    unless ``sample_posterior`` is False.
    """
    area = area if area is not None else video.shape[1] * video.shape[2]
    if noise is None:
        noise = Noise.seeded(latent_shape_for(cfg, video, area), seed, sample_posterior)
    content = getattr(backend, "host_dtype", torch.float32)
    ops = HostOps(resize=torch_resize, colour_fix=lambda dec, x: wavelet_color_fix(dec, x, content),
                  rnd=host_round(backend))
    return host.restore(cfg, backend, video, txt, noise, area=area, colour_fix=colour_fix, ops=ops)
