"""Causal 3D video VAE reference (video_vae_v3, s8_c16_t4), fp32, written from the spec.

Layout ``(B, C, T, H, W)``. Names follow diffusers' Encoder/Decoder as the official checkpoint
does (``encoder.down_blocks.1.resnets.0.conv_shortcut.weight``,
``decoder.up_blocks.0.upsamplers.0.upscale_conv.weight``, ``mid_block.attentions.0.to_out.0``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ncnnport.models.seedvr2.config import VAEConfig
from ncnnport.models.seedvr2.host import latent_frames  # noqa: F401 (the VAE's frame rule, torch-free)


class CausalConv3d(nn.Conv3d):
    """Conv3d that is causal in time: ``kt-1`` copies of frame 0 are prepended, nothing is
    appended, so output frame i only sees input frames <= i (and T frames stay T at stride 1)."""

    def __init__(self, cin: int, cout: int, kernel: tuple[int, int, int] = (3, 3, 3),
                 stride: tuple[int, int, int] = (1, 1, 1), spatial_padding: bool = True) -> None:
        pad = (0, kernel[1] // 2, kernel[2] // 2) if spatial_padding else (0, 0, 0)
        super().__init__(cin, cout, kernel, stride=stride, padding=pad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kt = self.kernel_size[0]
        if kt > 1:
            x = torch.cat([x[:, :, :1]] * (kt - 1) + [x], dim=2)
        return super().forward(x)


def frame_group_norm(norm: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """GroupNorm applied to every frame on its own (statistics never mix frames)."""
    b, c, t, h, w = x.shape
    y = norm(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
    return y.reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4)


class ResnetBlock3D(nn.Module):
    def __init__(self, cin: int, cout: int, cfg: VAEConfig) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(cfg.norm_groups, cin, eps=cfg.norm_eps)
        self.conv1 = CausalConv3d(cin, cout)
        self.norm2 = nn.GroupNorm(cfg.norm_groups, cout, eps=cfg.norm_eps)
        self.conv2 = CausalConv3d(cout, cout)
        self.conv_shortcut = CausalConv3d(cin, cout, (1, 1, 1)) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(frame_group_norm(self.norm1, x)))
        h = self.conv2(F.silu(frame_group_norm(self.norm2, h)))
        skip = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        return skip + h


class FrameAttention(nn.Module):
    """Single-head self-attention over each frame's h*w tokens, with residual."""

    def __init__(self, c: int, cfg: VAEConfig) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(cfg.norm_groups, c, eps=cfg.norm_eps)
        self.to_q = nn.Linear(c, c)
        self.to_k = nn.Linear(c, c)
        self.to_v = nn.Linear(c, c)
        self.to_out = nn.ModuleList([nn.Linear(c, c), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = frame_group_norm(self.group_norm, x).permute(0, 2, 3, 4, 1).reshape(b * t, h * w, c)
        o = F.scaled_dot_product_attention(self.to_q(y), self.to_k(y), self.to_v(y),
                                           scale=1.0 / math.sqrt(c))
        o = self.to_out[0](o).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        return x + o


class MidBlock3D(nn.Module):
    def __init__(self, c: int, cfg: VAEConfig) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock3D(c, c, cfg), ResnetBlock3D(c, c, cfg)])
        self.attentions = nn.ModuleList([FrameAttention(c, cfg)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class Downsample3D(nn.Module):
    """Zero-pad right/bottom by 1, then a stride-2 conv: (1,3,3) spatial-only, or 3x3x3 causal
    space-time (2 head copies of frame 0, time stride 2: T -> (T-1)/2 + 1)."""

    def __init__(self, c: int, temporal: bool) -> None:
        super().__init__()
        self.temporal = temporal
        kernel = (3, 3, 3) if temporal else (1, 3, 3)
        stride = (2, 2, 2) if temporal else (1, 2, 2)
        self.conv = CausalConv3d(c, c, kernel, stride=stride, spatial_padding=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample3D(nn.Module):
    """1x1x1 conv to r*C channels, depth-to-space with channel order (x y [z] c), then a causal
    3x3x3 conv. The space-time variant drops output frame 1 (f -> 2f-1 frames)."""

    def __init__(self, c: int, temporal: bool) -> None:
        super().__init__()
        self.temporal = temporal
        self.factor = 8 if temporal else 4
        self.upscale_conv = nn.Conv3d(c, c * self.factor, 1)
        self.conv = CausalConv3d(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.upscale_conv(x)
        b, _, f, h, w = y.shape
        if self.temporal:
            c = y.shape[1] // 8
            y = y.reshape(b, 2, 2, 2, c, f, h, w).permute(0, 4, 5, 3, 6, 1, 7, 2)
            y = y.reshape(b, c, f * 2, h * 2, w * 2)
            y = torch.cat([y[:, :, :1], y[:, :, 2:]], dim=2)
        else:
            c = y.shape[1] // 4
            y = y.reshape(b, 2, 2, c, f, h, w).permute(0, 3, 4, 5, 1, 6, 2)
            y = y.reshape(b, c, f, h * 2, w * 2)
        return self.conv(y)


class DownBlock3D(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, down: str | None, cfg: VAEConfig) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock3D(cin if i == 0 else cout, cout, cfg) for i in range(layers)])
        self.downsamplers = nn.ModuleList([Downsample3D(cout, down == "st")]) if down else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for r in self.resnets:
            x = r(x)
        return self.downsamplers[0](x) if self.downsamplers is not None else x


class UpBlock3D(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, up: str | None, cfg: VAEConfig) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock3D(cin if i == 0 else cout, cout, cfg) for i in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample3D(cout, up == "st")]) if up else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for r in self.resnets:
            x = r(x)
        return self.upsamplers[0](x) if self.upsamplers is not None else x


class Encoder3D(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        ch = cfg.block_out_channels
        self.conv_in = CausalConv3d(cfg.in_channels, ch[0])
        blocks = []
        for i, cout in enumerate(ch):
            cin = ch[max(i - 1, 0)]
            down = None if i == len(ch) - 1 else ("st" if i in cfg.temporal_down_blocks else "s")
            blocks.append(DownBlock3D(cin, cout, cfg.layers_per_block, down, cfg))
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = MidBlock3D(ch[-1], cfg)
        self.conv_norm_out = nn.GroupNorm(cfg.norm_groups, ch[-1], eps=cfg.norm_eps)
        self.conv_out = CausalConv3d(ch[-1], 2 * cfg.latent_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for b in self.down_blocks:
            x = b(x)
        x = self.mid_block(x)
        return self.conv_out(F.silu(frame_group_norm(self.conv_norm_out, x)))


class Decoder3D(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        rev = tuple(reversed(cfg.block_out_channels))
        n = len(rev)
        self.conv_in = CausalConv3d(cfg.latent_channels, rev[0])
        self.mid_block = MidBlock3D(rev[0], cfg)
        blocks = []
        for i, cout in enumerate(rev):
            cin = rev[max(i - 1, 0)]
            mirror = n - 2 - i  # encoder block whose downsample this upsample undoes
            up = None if i == n - 1 else ("st" if mirror in cfg.temporal_down_blocks else "s")
            blocks.append(UpBlock3D(cin, cout, cfg.layers_per_block + 1, up, cfg))
        self.up_blocks = nn.ModuleList(blocks)
        self.conv_norm_out = nn.GroupNorm(cfg.norm_groups, rev[-1], eps=cfg.norm_eps)
        self.conv_out = CausalConv3d(rev[-1], cfg.in_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z))
        for b in self.up_blocks:
            x = b(x)
        return self.conv_out(F.silu(frame_group_norm(self.conv_norm_out, x)))


class VideoAutoencoderKL(nn.Module):
    def __init__(self, cfg: VAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder3D(cfg)
        self.decoder = Decoder3D(cfg)

    def encode_moments(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,3,T,H,W) in [-1,1] -> posterior mean and clamped logvar (B,16,(T-1)/4+1,H/8,W/8)."""
        m = self.encoder(x)
        c = self.cfg.latent_channels
        return m[:, :c], m[:, c:].clamp(self.cfg.logvar_min, self.cfg.logvar_max)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)


def video_frames(latents: int, temporal_factor: int = 4) -> int:
    """n+1 latent frames -> 4n+1 decoded frames (each temporal upsample gives 2f-1)."""
    return (latents - 1) * temporal_factor + 1
