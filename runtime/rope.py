"""RoPE tables computed on the host and fed to graphs as inputs.

Graphs take cos/sin as inputs instead of computing them, so one converted graph serves every
position (no position baked in) and the tables are computed once, in float64, per call.
Layout is rotate-half style: ``cos = cat(cos(p*f), cos(p*f))`` over the last axis.
"""

from __future__ import annotations

import numpy as np


def inv_freq(rotary_dim: int, theta: float) -> np.ndarray:
    """``1 / theta^(2i/d)`` for i in [0, d/2), as transformers' default rope computes it."""
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
    exponent = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / rotary_dim
    return (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)


def cos_sin(positions: np.ndarray, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables ``[len(positions), 2*len(freqs)]`` (float32) for rotate-half RoPE.

    The angle is formed in float32 exactly as transformers does (``pos.float() @ inv_freq``), so
    tables match the reference bit for bit rather than to 1e-7.
    """
    pos = np.asarray(positions, dtype=np.float32).reshape(-1, 1)
    angles = pos * freqs.astype(np.float32).reshape(1, -1)
    emb = np.concatenate([angles, angles], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


def span(start: int, length: int, rotary_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin ``[1, length, rotary_dim]`` (with the batch axis graphs take) for the positions
    ``start .. start + length - 1``: the RoPE inputs of a prefill (start 0 or the cache length)
    and of one decode step (length 1), in every model's example inputs, bench inputs and pipeline."""
    cos, sin = cos_sin(np.arange(start, start + length), inv_freq(rotary_dim, theta))
    return cos[None], sin[None]
