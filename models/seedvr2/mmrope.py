"""3-axis multimodal RoPE (MMRoPE) tables (spec section 2).

Head channels are split into three axis groups of ``axis_dim`` channels (t, h, w); the remaining
channels (126, 127 at head_dim 128) are not rotated. Within a group, adjacent channels (2k, 2k+1)
form a rotation pair with frequency ``freqs[k]``. Tables are full-width ``[n, head_dim]`` with
cos = 1 and sin = 0 on the unrotated tail, so the graph applies one expression everywhere.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ncnnport.models.seedvr2.windows import text_positions, video_positions  # noqa: F401 (re-exported)


def rope_freqs(axis_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """``1 / theta^(arange(0, axis_dim, 2) / axis_dim)``: 21 values at axis_dim 42."""
    return 1.0 / (theta ** (torch.arange(0, axis_dim, 2)[: axis_dim // 2].float() / axis_dim))


class RotaryFreqs(nn.Module):
    """Holds the persistent ``freqs`` buffer under the official name ``...rope.rope.freqs``.

    A strict load of the real checkpoint needs these 32 buffers; the tables below are built
    from the loaded buffer so a checkpoint with other frequencies is honoured.
    """

    def __init__(self, axis_dim: int, theta: float) -> None:
        super().__init__()
        self.register_buffer("freqs", rope_freqs(axis_dim, theta), persistent=True)


class MMRoPE3d(nn.Module):
    """Wrapper named ``rope`` inside each attention so the buffer path is ``attn.rope.rope.freqs``."""

    def __init__(self, head_dim: int, axis_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.axis_dim = axis_dim
        self.rope = RotaryFreqs(axis_dim, theta)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[n, head_dim]`` (fp32) for integer positions ``[n, 3]`` (t, h, w), on the
        device of the ``freqs`` buffer (host positions follow the module, e.g. onto CUDA)."""
        freqs = self.rope.freqs.float()
        pos = positions.to(device=freqs.device, dtype=torch.float32)
        parts = []
        for axis in range(3):
            ang = pos[:, axis : axis + 1] * freqs[None, :]            # [n, axis_dim/2]
            parts.append(ang.repeat_interleave(2, dim=1))              # pairs (2k, 2k+1)
        ang = torch.cat(parts, dim=1)
        tail = self.head_dim - ang.shape[1]
        cos = torch.cat([ang.cos(), torch.ones(ang.shape[0], tail, device=ang.device)], dim=1)
        sin = torch.cat([ang.sin(), torch.zeros(ang.shape[0], tail, device=ang.device)], dim=1)
        return cos, sin


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1) -> (-x1, x0) on adjacent channel pairs."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x*cos + rotate_pairs(x)*sin`` in fp32; cos/sin broadcast over leading axes."""
    return x * cos + rotate_pairs(x) * sin
