"""Axial 2D RoPE tables for vision towers (Qwen2-VL / Qwen2.5-VL / Youtu-VL style).

Why a separate file: ``rope.cos_sin`` builds 1D tables ``cat(p*f, p*f)``; vision towers with 2D
positions rotate the first half of each head by the row index and the second half by the column
index, laid out ``[h*f | w*f | h*f | w*f]`` so that a plain rotate_half over the head applies it.
Angles are formed in float32 as the PyTorch references do (``pos.float() * inv_freq``).
"""

from __future__ import annotations

import numpy as np

from ncnnport.runtime.rope import inv_freq


def axial_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """Frequencies for one axis: ``head_dim/2`` rotary dims per axis, i.e. ``head_dim/4`` pairs."""
    if head_dim % 4:
        raise ValueError(f"head_dim {head_dim} must be divisible by 4 for axial 2D RoPE")
    return inv_freq(head_dim // 2, theta)


def axial_cos_sin(positions_hw: np.ndarray, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin ``[N, 4*len(freqs)]`` float32 for ``positions_hw [N, 2]`` (row, col) per token."""
    pos = np.asarray(positions_hw)
    if pos.ndim != 2 or pos.shape[1] != 2:
        raise ValueError(f"positions_hw must be [N, 2], got {pos.shape}")
    f = freqs.astype(np.float32).reshape(1, -1)
    rows = pos[:, :1].astype(np.float32) * f
    cols = pos[:, 1:].astype(np.float32) * f
    half = np.concatenate([rows, cols], axis=-1)
    emb = np.concatenate([half, half], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
