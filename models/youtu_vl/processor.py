"""Image preprocessing and the patch/window layout, on the host (numpy + PIL).

Why on the host: the resize rule loops over a float scale, and the window partition depends on
the grid; neither traces into a graph. The same functions feed the PyTorch reference and the
ncnn pipeline, so both see identical pixels, positions and windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ncnnport.models.youtu_vl.config import ProcessorConfig, VisionConfig


def target_size(height: int, width: int, *, patch: int = 16, merge: int = 2,
                max_num_patches: int = 36864, step: float = 0.02) -> tuple[int, int]:
    """Resized (H', W') by the official rule (spec section 2).

    Both sides round UP to a multiple of ``patch*merge`` (32 px) at ``scale = 1``; while the patch
    count exceeds the cap, ``scale -= step`` in place. The decrement accumulates in binary
    floating point (1 - 0.02 - 0.02 ... is not 1 - k*0.02), which decides the size at the
    boundary, so it is kept as an in-place subtraction.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size {height}x{width} is empty")
    unit = patch * merge
    scale = 1.0
    while True:
        h = max(unit, math.ceil(height * scale / unit) * unit)
        w = max(unit, math.ceil(width * scale / unit) * unit)
        if (h // patch) * (w // patch) <= max_num_patches:
            return h, w
        scale -= step
        if scale <= 0:
            raise ValueError(f"cannot fit a {height}x{width} image into {max_num_patches} patches")


def resize_normalize(image: Image.Image, size_hw: tuple[int, int], proc: ProcessorConfig) -> np.ndarray:
    """RGB uint8 -> antialiased bilinear resize (PIL) -> ``(x/255 - mean)/std`` as ``[C,H,W]`` float32."""
    rgb = image.convert("RGB")
    h, w = size_hw
    if rgb.size != (w, h):
        rgb = rgb.resize((w, h), resample=Image.Resampling.BILINEAR)
    x = np.asarray(rgb, dtype=np.float32) / np.float32(255.0)
    mean = np.asarray(proc.image_mean, dtype=np.float32)
    std = np.asarray(proc.image_std, dtype=np.float32)
    x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def patchify(chw: np.ndarray, patch: int, merge: int) -> np.ndarray:
    """``[C,H,W]`` -> ``[gh*gw, patch*patch*C]`` rows in merge-block-major order, (py,px,c) inside a row.

    Rows are ordered (block_y, block_x, dy, dx): every ``merge**2`` consecutive rows form one
    merge block, which the merger concatenates. Inside a row pixels are channel-last.
    """
    c, h, w = chw.shape
    gh, gw = h // patch, w // patch
    if gh * patch != h or gw * patch != w or gh % merge or gw % merge:
        raise ValueError(f"image {h}x{w} is not a multiple of patch*merge = {patch * merge}")
    x = chw.reshape(c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(1, 4, 2, 5, 3, 6, 0)
    return np.ascontiguousarray(x.reshape(gh * gw, patch * patch * c))


def patch_positions(gh: int, gw: int, merge: int) -> np.ndarray:
    """``[gh*gw, 2]`` int64 (row, col) of every patch, in the same merge-block-major order."""
    hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    shape = (gh // merge, merge, gw // merge, merge)
    hh = hh.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    ww = ww.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.stack([hh, ww], axis=-1).astype(np.int64)


def window_layout(gh: int, gw: int, merge: int, window_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(window_index over merged tokens, cu_seqlens over patches) for window attention.

    The merged grid ``(gh/merge, gw/merge)`` is padded to multiples of ``window_tokens``; windows
    are enumerated row-major and tokens inside a window row-major. Empty windows (padding only)
    contribute no boundary, so ``cu_seqlens`` is strictly increasing.
    """
    hm, wm = gh // merge, gw // merge
    nwh = -(-hm // window_tokens)
    nww = -(-wm // window_tokens)
    index: list[np.ndarray] = []
    cu = [0]
    grid = np.arange(hm * wm).reshape(hm, wm)
    for r in range(nwh):
        for c in range(nww):
            block = grid[r * window_tokens:(r + 1) * window_tokens, c * window_tokens:(c + 1) * window_tokens]
            if block.size == 0:
                continue
            index.append(block.reshape(-1))
            cu.append(cu[-1] + block.size * merge * merge)
    return np.concatenate(index).astype(np.int64), np.asarray(cu, dtype=np.int64)


def patch_permutation(window_index: np.ndarray, merge_unit: int) -> np.ndarray:
    """Window order at patch granularity: each merged token moves with its ``merge_unit`` patches."""
    return (window_index[:, None] * merge_unit + np.arange(merge_unit)[None, :]).reshape(-1)


@dataclass
class ProcessedImage:
    """Everything the vision tower needs for one image."""

    pixel_values: np.ndarray   # [N, patch_dim] float32, merge-block-major
    grid_hw: tuple[int, int]   # patch grid (gh, gw)
    resized_hw: tuple[int, int]
    original_hw: tuple[int, int]
    merge_unit: int = 4        # patches per merged token

    @property
    def num_patches(self) -> int:
        return self.grid_hw[0] * self.grid_hw[1]

    @property
    def num_tokens(self) -> int:
        """Merged visual tokens = number of ``<|image_pad|>`` in the prompt."""
        return self.num_patches // self.merge_unit


def process_image(image: Image.Image, vision: VisionConfig, proc: ProcessorConfig,
                  max_num_patches: int | None = None) -> ProcessedImage:
    """PIL image -> pixel_values and grid, as the official processor (spec section 2)."""
    w0, h0 = image.size
    cap = proc.max_num_patches if max_num_patches is None else max_num_patches
    h, w = target_size(h0, w0, patch=vision.patch_size, merge=vision.spatial_merge_size,
                       max_num_patches=cap, step=proc.scale_step)
    chw = resize_normalize(image, (h, w), proc)
    pv = patchify(chw, vision.patch_size, vision.spatial_merge_size)
    return ProcessedImage(pv.astype(np.float32), (h // vision.patch_size, w // vision.patch_size),
                          (h, w), (h0, w0), vision.merge_unit)
