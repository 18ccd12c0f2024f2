"""numpy equivalents of SeedVR2's two torch host steps, for a torch-free run path: the
antialiased bicubic area resize (``F.interpolate(mode="bicubic", antialias=True)``) and the
wavelet colour fix (dilated 3x3 binomial blurs). Not yet used by ``run``; their distance to the
torch versions is measured by tests/models/seedvr2/test_host_numpy.py.

The resize follows ATen's separable antialias kernel (``_upsample_bicubic2d_aa``): Keys cubic
with a = -0.5, support 2 x scale when downsampling, taps normalised to sum 1, centre
``scale * (i + 0.5)``, the width pass before the height pass, float32 accumulation tap by tap.
"""

from __future__ import annotations

import numpy as np

A = -0.5


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic kernel (a = -0.5), float32."""
    x = np.abs(x).astype(np.float32)
    a = np.float32(A)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, np.float32(0))).astype(np.float32)


def aa_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices [out, taps] int64, weights [out, taps] float32) of one axis; unused taps have
    weight 0 and index 0."""
    scale = np.float32(in_size / out_size)
    support = np.float32(2.0) * scale if scale >= 1 else np.float32(2.0)
    invscale = np.float32(1.0) / scale if scale >= 1 else np.float32(1.0)
    rows = []
    for i in range(out_size):
        center = scale * np.float32(i + 0.5)
        xmin = max(int(center - support + np.float32(0.5)), 0)
        xsize = min(int(center + support + np.float32(0.5)), in_size) - xmin
        j = np.arange(xsize, dtype=np.float32)
        w = _cubic((j + np.float32(xmin) - center + np.float32(0.5)) * invscale)
        total = np.float32(w.sum(dtype=np.float32))
        rows.append((xmin, w / total if total != 0 else w))
    taps = max(len(w) for _, w in rows)
    idx = np.zeros((out_size, taps), np.int64)
    wts = np.zeros((out_size, taps), np.float32)
    for i, (xmin, w) in enumerate(rows):
        idx[i, :len(w)] = np.arange(xmin, xmin + len(w))
        wts[i, :len(w)] = w
    return idx, wts


def _resize_last_axis(x: np.ndarray, out_size: int) -> np.ndarray:
    idx, w = aa_weights(x.shape[-1], out_size)
    out = x[..., idx[:, 0]] * w[:, 0]
    for j in range(1, idx.shape[1]):
        out = out + x[..., idx[:, j]] * w[:, j]
    return out.astype(np.float32)


def resize_bicubic_aa(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 (..., H, W) -> (..., height, width): width pass, then height pass."""
    y = _resize_last_axis(np.asarray(x, np.float32), width) if x.shape[-1] != width else np.asarray(x, np.float32)
    if y.shape[-2] != height:
        y = np.swapaxes(_resize_last_axis(np.swapaxes(y, -1, -2), height), -1, -2)
    return np.ascontiguousarray(y)


KERNEL = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / np.float32(16.0)


def wavelet_blur(x: np.ndarray, radius: int) -> np.ndarray:
    """(C, H, W) float32 blurred by the binomial 3x3 kernel dilated by ``radius``, edges replicated."""
    h, w = x.shape[-2:]
    xp = np.pad(x, ((0, 0), (radius, radius), (radius, radius)), mode="edge")
    out = np.zeros_like(x, dtype=np.float32)
    for ky in range(3):
        for kx in range(3):
            out += KERNEL[ky, kx] * xp[:, ky * radius:ky * radius + h, kx * radius:kx * radius + w]
    return out


def wavelet_split(x: np.ndarray, levels: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) parts: ``levels`` blurs with radius 2^i (pipeline.wavelet_split)."""
    high = np.zeros_like(x, dtype=np.float32)
    low = x
    for i in range(levels):
        blurred = wavelet_blur(low, 2 ** i)
        high = high + (low - blurred)
        low = blurred
    return high, low


def wavelet_color_fix(output: np.ndarray, source: np.ndarray) -> np.ndarray:
    """float32 form of ``pipeline.wavelet_color_fix``: per frame, the output's high frequencies
    plus the source's low ones; both (3, T, H, W)."""
    res = np.empty(output.shape, np.float32)
    for t in range(output.shape[1]):
        high, _ = wavelet_split(np.asarray(output[:, t], np.float32))
        _, low = wavelet_split(np.asarray(source[:, t], np.float32))
        res[:, t] = high + low
    return res
