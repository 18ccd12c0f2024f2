"""numpy equivalents of SeedVR2's torch host steps, for the torch-free run path (``host.py``,
``packaged.py``): the antialiased bicubic area resize (``F.interpolate(mode="bicubic",
antialias=True)``), the wavelet colour fix (dilated 3x3 binomial blurs), the DiT's RoPE/timestep
table lookups and bf16 rounding. Their distance to the torch versions is measured by
tests/models/seedvr2/test_host_numpy.py.

The resize follows ATen's separable antialias kernel (``_upsample_bicubic2d_aa``): Keys cubic
with a = -0.5 in its Horner form, support 2 x scale when downsampling, taps normalised to sum 1,
centre ``scale * (i + 0.5)`` (in double, stored as float), the width pass before the height
pass, float32 accumulation tap by tap. ATen's CPU kernels are compiled with FMA contraction, so
the cubic's Horner steps and the tap accumulation are fused multiply-adds here too (emulated
through float64: the product is exact there). Measured: bit-exact for every upscale tried (the
super-resolution case), 1 float32 ulp off in ~30 % of values when downscaling (ATen's
downscale accumulation order, with 8+ taps, is not reproduced).
"""

from __future__ import annotations

import numpy as np

A = -0.5


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once (the product is exact in float64; the float64 sum's
    second rounding can only differ from a true fma on a rare exact tie)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic kernel (a = -0.5), float32, in ATen's Horner form with fused steps:
    ``((a + 2) x - (a + 3)) x x + 1`` below 1 and ``((a x - 5a) x + 8a) x - 4a`` below 2."""
    x = np.abs(np.asarray(x, np.float32))
    a = np.float32(A)
    u = _fma(a + np.float32(2), x, -(a + np.float32(3)))
    near = _fma((u * x).astype(np.float32), x, np.float32(1))
    p = _fma(a, x, np.float32(-5) * a)
    q = _fma(p, x, np.float32(8) * a)
    far = _fma(q, x, np.float32(-4) * a)
    return np.where(x < 1, near, np.where(x < 2, far, np.float32(0))).astype(np.float32)


def aa_weights(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices [out, taps] int64, weights [out, taps] float32) of one axis; unused taps have
    weight 0 and index 0."""
    scale = np.float32(in_size) / np.float32(out_size)
    support = np.float32(2.0) * scale if scale >= 1 else np.float32(2.0)
    invscale = np.float32(1.0) / scale if scale >= 1 else np.float32(1.0)
    rows = []
    for i in range(out_size):
        center = np.float32(np.float64(scale) * (i + 0.5))
        xmin = max(int(np.float64(center - support) + 0.5), 0)
        xsize = min(int(np.float64(center + support) + 0.5), in_size) - xmin
        j = (np.arange(xsize) + xmin).astype(np.float32)
        w = _cubic(((j - center).astype(np.float64) + 0.5) * np.float64(invscale))
        total = np.float32(0)
        for v in w:  # float32, tap by tap
            total = np.float32(total + v)
        rows.append((xmin, (w / total).astype(np.float32) if total != 0 else w))
    taps = max(len(w) for _, w in rows)
    idx = np.zeros((out_size, taps), np.int64)
    wts = np.zeros((out_size, taps), np.float32)
    for i, (xmin, w) in enumerate(rows):
        idx[i, :len(w)] = np.arange(xmin, xmin + len(w))
        wts[i, :len(w)] = w
    return idx, wts


def _resize_last_axis(x: np.ndarray, out_size: int) -> np.ndarray:
    """One separable pass: first tap a plain product, every further tap a fused multiply-add
    (a zero-weight padding tap adds an exact 0)."""
    idx, w = aa_weights(x.shape[-1], out_size)
    out = (x[..., idx[:, 0]] * w[:, 0]).astype(np.float32)
    for j in range(1, idx.shape[1]):
        out = _fma(x[..., idx[:, j]], w[:, j], out)
    return out


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


# --- DiT host tables -------------------------------------------------------------------------
def pair_to_half_perm(head_dim: int) -> np.ndarray:
    """Channel order that turns adjacent-pair rotation into rotate-half: evens then odds."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def depth_to_space(y: np.ndarray, temporal: bool) -> np.ndarray:
    """Host-side rearrange ``b (x y [z] c) f h w -> b c (f [z]) (h x) (w y)``; the space-time
    variant then drops output frame 1 (2f-1 frames). Pure data movement, exact."""
    b, ch, f, h, w = y.shape
    if temporal:
        c = ch // 8
        z = y.reshape(b, 2, 2, 2, c, f, h, w).transpose(0, 4, 5, 3, 6, 1, 7, 2)
        z = z.reshape(b, c, f * 2, h * 2, w * 2)
        z = np.concatenate([z[:, :, :1], z[:, :, 2:]], axis=2)
    else:
        c = ch // 4
        z = y.reshape(b, 2, 2, c, f, h, w).transpose(0, 3, 4, 5, 1, 6, 2).reshape(b, c, f, h * 2, w * 2)
    return np.ascontiguousarray(z, dtype=np.float32)


def rope_rows(cos_angles: np.ndarray, sin_angles: np.ndarray, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-axis cos/sin ``[n, 3, F]`` of the angles ``position * freq_k`` -> full-width pair-layout
    tables ``[n, head_dim]`` (mmrope.MMRoPE3d.tables): each value repeated for its channel pair
    (2k, 2k+1), axes t, h, w in turn, cos 1 / sin 0 on the unrotated tail."""
    n = cos_angles.shape[0]
    cos = np.repeat(cos_angles, 2, axis=-1).reshape(n, -1)
    sin = np.repeat(sin_angles, 2, axis=-1).reshape(n, -1)
    tail = head_dim - cos.shape[1]
    cos = np.concatenate([cos, np.ones((n, tail), np.float32)], axis=1)
    sin = np.concatenate([sin, np.zeros((n, tail), np.float32)], axis=1)
    return cos.astype(np.float32), sin.astype(np.float32)


class TrigTables:
    """cos/sin of every RoPE angle ``p * freq_k`` for integer positions p < ``positions``, and the
    timestep sinusoid at the model's one timestep, as torch computed them when the package was
    converted (``assets/host_tables.npz``).

    Why a lookup and not ``np.cos``: torch's float32 sin/cos are not numpy's (1-ulp differences
    in about 17 % of the RoPE values, 31 of 256 sinusoid values), and the angles are always
    integer positions times the same frequencies, so a table indexed by position gives the torch
    run path's tables bit for bit. Positions are window-local, so the table is small."""

    def __init__(self, cos: np.ndarray, sin: np.ndarray, timestep: float, sinusoid: np.ndarray,
                 source: str) -> None:
        if cos.shape != sin.shape or cos.ndim != 2 or sinusoid.ndim != 1:
            raise ValueError(f"{source}: 'cos'/'sin' must be equal [positions, freqs] arrays and "
                             f"'sinusoid' 1-D; got {cos.shape}, {sin.shape}, {sinusoid.shape}")
        self.cos, self.sin = np.asarray(cos, np.float32), np.asarray(sin, np.float32)
        self.timestep, self.sinusoid, self.source = float(timestep), np.asarray(sinusoid, np.float32), source

    def angles(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) of integer ``positions`` (any shape) -> shape + (F,)."""
        top = int(positions.max()) if positions.size else 0
        if top >= self.cos.shape[0] or (positions.size and int(positions.min()) < 0):
            raise ValueError(f"{self.source}: RoPE position {top} is outside the packaged table "
                             f"(0..{self.cos.shape[0] - 1}); the input's window extent is too large")
        return self.cos[positions], self.sin[positions]

    def timestep_sinusoid(self, t: float) -> np.ndarray:
        """The ``dit_embedding`` input for timestep ``t`` (only the packaged one exists)."""
        if float(t) != self.timestep:
            raise ValueError(f"{self.source}: holds the sinusoid of timestep {self.timestep}, asked for {t}")
        return self.sinusoid


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bfloat16 value (ties to even), kept as float32: the dtype the official
    draws have, applied to numpy draws (finite inputs)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.astype(np.uint32).view(np.float32)
