"""Frame comparison numbers shared by the in-memory and the streamed SeedVR2 parity: frames as
image rows for the worst-row cosine, and the 8-bit image statistics reported beside every gate."""

from __future__ import annotations

from typing import Any

import numpy as np


def image_rows(frames: np.ndarray) -> np.ndarray:
    """uint8 (T, H, W, 3) -> float32 (T*H, W*3): the worst-row cosine then runs over image rows,
    not over single RGB triplets (one pixel 1 level off on a black pixel is cosine 0 there)."""
    t, h, w, c = frames.shape
    return frames.reshape(t * h, w * c).astype(np.float32)


def psnr(ref: np.ndarray, cand: np.ndarray) -> float:
    mse = float(np.mean((ref.astype(np.float64) - cand.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10.0 * np.log10(255.0 ** 2 / mse))


def image_stats(ref: np.ndarray, cand: np.ndarray) -> dict[str, Any]:
    d = np.abs(ref.astype(np.int16) - cand.astype(np.int16))
    return {"image_max_abs": int(d.max()), "image_mae": float(d.mean()), "psnr_db": psnr(ref, cand),
            "differing_bytes": int((d > 0).sum()), "total_bytes": int(d.size)}
