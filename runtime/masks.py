"""Additive attention masks built on the host (graphs take them as inputs: pnnx cannot convert
shape-dependent mask construction, and an explicit mask lets one graph serve every length)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

# Large negative instead of -inf: softmax over a fully masked row stays finite in ncnn.
MASKED = np.float32(-1e30)


def causal(q_len: int, past_len: int = 0, hidden: Sequence[int] = ()) -> np.ndarray:
    """``[1, q_len, past_len + q_len]``: query i sees keys ``0 .. past_len + i`` except the
    ``hidden`` key positions (e.g. a cache's placeholder row, which no query may attend to)."""
    total = past_len + q_len
    key = np.arange(total)[None, :]
    query = past_len + np.arange(q_len)[:, None]
    mask = np.where(key <= query, np.float32(0), MASKED).astype(np.float32)
    mask[:, list(hidden)] = MASKED
    return mask[None]


def block_diagonal(cu_seqlens: Sequence[int]) -> np.ndarray:
    """``[1, N, N]`` mask allowing attention only inside each ``[cu[i], cu[i+1])`` block."""
    cu = [int(c) for c in cu_seqlens]
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must start at 0 and be non-decreasing, got {cu}")
    n = cu[-1]
    block = np.zeros(n, dtype=np.int64)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        block[a:b] = i
    mask = np.where(block[:, None] == block[None, :], np.float32(0), MASKED).astype(np.float32)
    return mask[None]


def full(n: int) -> np.ndarray:
    """``[1, N, N]`` of zeros: everything attends to everything."""
    return np.zeros((1, n, n), dtype=np.float32)
