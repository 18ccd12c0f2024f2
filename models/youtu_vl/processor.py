"""Image loading, preprocessing and the patch/window layout, on the host (numpy + PIL, no torch).

Why on the host: the resize rule loops over a float scale, and the window partition depends on
the grid; neither traces into a graph. The same functions feed the PyTorch reference and the
ncnn pipeline, so both see identical pixels, positions and windows.

Official path (what this file reproduces bit for bit):
- loading: transformers ``load_image`` (what ``processor.apply_chat_template`` uses):
  ``PIL.ImageOps.exif_transpose`` then ``convert("RGB")``;
- the model card's ``image_processing_siglip2_fast.py``: ``get_image_size_for_patches`` (sizes),
  torchvision ``resize`` BILINEAR with ``antialias=True`` on the uint8 CHW tensor (on an AVX2 CPU
  torchvision calls torch's uint8 antialiased kernel directly, no float round trip), then the
  fast processor's fused rescale+normalize ``(x - 0.5*255) / (0.5*255)`` in float32.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
from PIL import Image, ImageOps

from ncnnport.models.youtu_vl.config import ProcessorConfig, VisionConfig

# PIL modes whose samples go above 255: convert("RGB") clips them (16-bit grey turns white).
_HIGH_DEPTH_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N", "F")
# PIL modes carrying an alpha band, which convert("RGB") drops without compositing.
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")


def conversion_warnings(image: Image.Image) -> list[str]:
    """What the official ``convert("RGB")`` will lose on ``image`` (empty when nothing).

    Why warn instead of fixing: parity is with the official model, which sees the mangled
    pixels; the user should know, but must get the same answer as the official pipeline.
    """
    notes: list[str] = []
    if image.mode in _HIGH_DEPTH_MODES:
        lo, hi = image.getextrema()
        if hi > 255 or lo < 0:
            notes.append(f"{image.mode} samples span {lo}..{hi}; the official RGB conversion clips "
                         "them to 0..255 (a 16-bit image comes out mostly white)")
    has_alpha = image.mode in _ALPHA_MODES or "transparency" in image.info
    if has_alpha:
        alpha_lo = image.getchannel("A").getextrema()[0] if image.mode in _ALPHA_MODES else 0
        if alpha_lo < 255:
            notes.append("transparency is dropped, not composited, by the official RGB conversion "
                         "(transparent pixels show their stored colour)")
    return notes


def load_image(path: str | Path, warn_to: TextIO | None = None) -> Image.Image:
    """Open ``path`` as the official loader does: EXIF orientation applied, then ``convert("RGB")``.

    Lossy conversions (16-bit clipping, dropped alpha) are kept, as the official path does them,
    and each is reported as one ``warning:`` line on ``warn_to`` (stderr by default).
    """
    out = sys.stderr if warn_to is None else warn_to
    with Image.open(path) as img:
        upright = ImageOps.exif_transpose(img)
        for note in conversion_warnings(upright):
            out.write(f"warning: {path}: {note}\n")
        return upright.convert("RGB")


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


def _aa_linear_filter(x: np.ndarray) -> np.ndarray:
    """The triangle filter of torch's antialiased bilinear mode."""
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


@dataclass(frozen=True)
class AxisWeights:
    """Fixed-point resampling taps of one axis: ``out[i] = sum_k in[start[i]+k] * taps[i,k]``,
    rounded by ``precision`` bits (torch's ``_compute_index_ranges_int16_weights``)."""

    start: np.ndarray      # [out] int64 first input index
    taps: np.ndarray       # [out, K] int64 (int16 range); zero past each row's size
    precision: int


def axis_weights(in_size: int, out_size: int) -> AxisWeights:
    """int16 taps of torch's uint8 antialiased bilinear kernel for one axis.

    Mirrors aten/src/ATen/native/cpu/UpSampleKernel.cpp step by step, in float64 with the same
    operation order, because a one-ulp change of a tap can move a rounded pixel: support
    ``max(scale, 1)``, ``xmin = trunc(center - support + 0.5)`` clipped at 0, taps normalised
    by their sum, precision = the largest shift keeping ``2 * max tap`` below 2**15, taps
    rounded half away from zero.
    """
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0
    width = int(math.ceil(support)) * 2 + 1
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    centers = scale * (np.arange(out_size, dtype=np.float64) + 0.5)
    start = np.maximum(np.trunc(centers - support + 0.5).astype(np.int64), 0)
    stop = np.minimum(np.trunc(centers + support + 0.5).astype(np.int64), in_size)
    size = np.clip(stop - start, 0, width)
    k = np.arange(width, dtype=np.int64)
    pos = (start[:, None] + k[None, :]).astype(np.float64)
    w = _aa_linear_filter((pos - centers[:, None] + 0.5) * invscale)
    w = np.where(k[None, :] < size[:, None], w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    w = np.where(total != 0.0, w / np.where(total != 0.0, total, 1.0), 0.0)
    precision = _weights_precision(float(w.max()))
    v = w * float(1 << precision)
    taps = np.where(v < 0, np.trunc(v - 0.5), np.trunc(v + 0.5)).astype(np.int64)
    return AxisWeights(start, taps, precision)


def _weights_precision(wt_max: float) -> int:
    """Bits of the fixed-point taps: stop before ``round(2 * wt_max * 2**p)`` reaches 2**15."""
    precision = 0
    while precision < 22:
        if int(0.5 + wt_max * (1 << (precision + 1))) >= (1 << 15):
            break
        precision += 1
    return precision


def _resample_axis(x: np.ndarray, axis: int, out_size: int) -> np.ndarray:
    """One separable pass over ``axis`` of a uint8 array: integer multiply-add, round, clip."""
    in_size = x.shape[axis]
    if in_size == out_size:
        return x
    aw = axis_weights(in_size, out_size)
    src = np.moveaxis(x, axis, 0).astype(np.int64)
    acc = np.full((out_size,) + src.shape[1:], 1 << (aw.precision - 1), dtype=np.int64)
    extra = (1,) * (src.ndim - 1)
    for k in range(aw.taps.shape[1]):
        idx = np.minimum(aw.start + k, in_size - 1)
        acc += src[idx] * aw.taps[:, k].reshape((out_size,) + extra)
    out = np.clip(acc >> aw.precision, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def resize_uint8(hwc: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """torch ``interpolate(mode="bilinear", antialias=True, align_corners=False)`` on uint8, bit-exact.

    This is what the official processor's torchvision resize runs on a uint8 image. Width is
    resampled first, then height, through a clipped uint8 intermediate, as torch does.
    """
    h, w = size_hw
    return _resample_axis(_resample_axis(hwc, 1, w), 0, h)


def resize_normalize(image: Image.Image, size_hw: tuple[int, int], proc: ProcessorConfig) -> np.ndarray:
    """RGB uint8 -> official resize -> fused ``(x - 255*mean) / (255*std)`` as ``[C,H,W]`` float32.

    The fast processor folds rescale (1/255) into mean and std and normalises in float32; doing
    ``x/255`` first gives different roundings on half of the 256 levels.
    """
    rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    resized = resize_uint8(rgb, size_hw).astype(np.float32)
    mean = np.asarray(proc.image_mean, dtype=np.float32) * np.float32(255.0)
    std = np.asarray(proc.image_std, dtype=np.float32) * np.float32(255.0)
    x = (resized - mean) / std
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
