"""Adaptive window partition of the patched video grid (spec section 2).

Kept free of torch: the same partition drives the PyTorch reference and the host-side gathers
of the ncnn runtime, so the two can never disagree about which token sits in which window.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Window = tuple[slice, slice, slice]  # (t, h, w) intervals of the patched grid


def window_sizes(grid: Sequence[int], num_windows: Sequence[int] = (4, 3, 3),
                 area: int = 3600, max_t: int = 30) -> tuple[int, int, int]:
    """Window extent (wt, wh, ww) for a patched grid (t, h, w).

    The grid is rescaled to the 720p token area (45x80 = 3600) before dividing into 3x3 spatial
    windows, so window size in tokens is roughly constant across resolutions. Python's round()
    (half-to-even) is part of the definition.
    """
    t, h, w = (int(v) for v in grid)
    scale = math.sqrt(area / (h * w))
    rh, rw = round(h * scale), round(w * scale)
    wh = math.ceil(rh / num_windows[1])
    ww = math.ceil(rw / num_windows[2])
    wt = math.ceil(min(t, max_t) / num_windows[0])
    return wt, wh, ww


def axis_intervals(n: int, size: int, shifted: bool) -> list[tuple[int, int]]:
    """Non-empty [start, stop) intervals covering 0..n with windows of ``size``.

    Shifted windows are offset by half a window, only on axes where one window does not already
    cover the whole extent; the first and last intervals may be tiny.
    """
    if shifted and size < n:
        s = 0.5
        count = math.ceil((n - s) / size) + 1
    else:
        s = 0.0
        count = math.ceil(n / size)
    out = []
    for i in range(count):
        a = max(int((i - s) * size), 0)
        b = min(int((i - s + 1) * size), n)
        if b > a:
            out.append((a, b))
    return out


def partition(grid: Sequence[int], shifted: bool, num_windows: Sequence[int] = (4, 3, 3),
              area: int = 3600, max_t: int = 30) -> list[Window]:
    """All windows of a grid: Cartesian product of per-axis intervals, iterated w, then h, then t
    (read here as w outermost, t innermost). The order only changes the float summation order of
    the text average over windows; video tokens go back to their own slots either way."""
    t, h, w = (int(v) for v in grid)
    wt, wh, ww = window_sizes(grid, num_windows, area, max_t)
    ts = axis_intervals(t, wt, shifted)
    hs = axis_intervals(h, wh, shifted)
    ws = axis_intervals(w, ww, shifted)
    return [(slice(*it), slice(*ih), slice(*iw)) for iw in ws for ih in hs for it in ts]


def window_token_index(grid: Sequence[int], windows: Sequence[Window]) -> list[np.ndarray]:
    """Flat (t, h, w) raster indices of each window's tokens, in raster order inside the window."""
    t, h, w = (int(v) for v in grid)
    flat = np.arange(t * h * w, dtype=np.int64).reshape(t, h, w)
    return [flat[win].reshape(-1) for win in windows]


def window_local_positions(windows: Sequence[Window]) -> list[np.ndarray]:
    """Per window, ``[n, 3]`` positions (t, h, w) LOCAL to the window (0-based), raster order."""
    out = []
    for st, sh, sw in windows:
        tt, hh, ww = np.meshgrid(np.arange(st.stop - st.start), np.arange(sh.stop - sh.start),
                                 np.arange(sw.stop - sw.start), indexing="ij")
        out.append(np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)], axis=1))
    return out


def text_positions(text_len: int) -> np.ndarray:
    """RoPE positions of the text: token i sits at (i, i, i) in every window."""
    i = np.arange(text_len)
    return np.stack([i, i, i], axis=1)


def video_positions(local: np.ndarray, text_len: int) -> np.ndarray:
    """RoPE positions of a window's video tokens: window-local (t, h, w) with the time axis offset
    by the text length."""
    pos = np.array(local, dtype=np.int64, copy=True)
    pos[:, 0] += text_len
    return pos
