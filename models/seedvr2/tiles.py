"""Opt-in spatial tiling of the SeedVR2 VAE (``run --vae-tile PX [--vae-overlap PX]``).

Why: the decoder's activations grow with the frame area (a 512x512 decode holds GBs of
activations), so 720p and 1080p frames do not fit a 24 GB machine untiled. Tiling bounds the
activations by one tile.

The official pipeline does NOT tile. ``models/video_vae_v3/modules/attn_video_vae.py`` raises
``NotImplementedError`` in ``tiled_encode`` / ``tiled_decode``; what
``projects/inference_seedvr2_3b.py`` enables instead is exact memory splitting
(``set_memory_limit(conv_max_mem=0.5, norm_max_mem=0.5)``: each causal conv split along H/W with
halo caches, GroupNorm in group chunks) and temporal slicing (``split_size: 4`` latent frames with
causal caches). Those change no number; this tiling does, because every tile is decoded with
zero padding at its borders and the mid block's attention is global over each frame. So tiled
output differs from the official (untiled) one; parity measures by how much.

The rule (a standard one, as diffusers' ``AutoencoderKL.tiled_decode``: overlapping tiles in
the network's INPUT space, linear ramps across the overlaps in its OUTPUT space), per axis:

* ``tile`` and ``overlap`` are pixels (multiples of the VAE's spatial factor); decode tiles the
  latent with ``tile / f`` rows and a stride of ``(tile - overlap) / f``, encode tiles the pixels
  with ``tile`` rows and a stride of ``tile - overlap``;
* tiles start at ``0, s, 2s, ...`` until one reaches the end; the last one is shorter (longer
  than the overlap, at most a tile), so consecutive tiles overlap by exactly ``overlap`` and no
  three tiles meet on an axis (``overlap <= tile / 2``);
* in the output, across each overlap of ``e`` rows, the later tile's weight rises
  ``(k + 0.5) / e`` and the earlier one's falls ``1 - (k + 0.5) / e``; a tile's 2-D weight is the
  product of its row and column weights (they sum to 1 everywhere, corners included; diffusers
  chains two in-place blends there instead, which weights a corner by the order of the blends);
* a frame that fits in one tile is not tiled: the result is the untiled one, bit for bit.

Torch-free (numpy only): the package run path wraps its backend the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

# diffusers' tile_overlap_factor: the default overlap is a quarter of the tile.
DEFAULT_OVERLAP_FRACTION = 0.25


@dataclass(frozen=True)
class TileSpec:
    """Tile and overlap in pixels, checked by :func:`tile_spec`."""

    tile: int
    overlap: int

    def describe(self) -> str:
        return f"VAE tiled {self.tile} px, overlap {self.overlap} px (not the official untiled VAE)"


def default_overlap(tile: int, factor: int) -> int:
    """A quarter of the tile, rounded down to a multiple of the spatial factor."""
    return int(tile * DEFAULT_OVERLAP_FRACTION) // factor * factor


def tile_spec(tile: int | None, overlap: int | None, factor: int) -> TileSpec | None:
    """The CLI's ``--vae-tile`` / ``--vae-overlap`` as a spec (None: untiled), or one ValueError
    line naming the option. ``factor`` is the VAE's spatial factor: a tile must map onto whole
    latent rows, and the overlap must leave a stride (``overlap <= tile / 2`` keeps every pixel
    in at most two tiles per axis)."""
    if tile is None:
        if overlap is not None:
            raise ValueError("--vae-overlap needs --vae-tile")
        return None
    if tile < 2 * factor or tile % factor:
        raise ValueError(f"--vae-tile {tile}: must be a multiple of {factor} px (the VAE's spatial factor), "
                         f"at least {2 * factor}")
    if overlap is None:
        overlap = default_overlap(tile, factor)
    if overlap < 0 or overlap % factor or 2 * overlap > tile:
        raise ValueError(f"--vae-overlap {overlap}: must be a multiple of {factor} px between 0 and half "
                         f"the tile ({tile // 2})")
    return TileSpec(tile, overlap)


def axis_tiles(size: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    """[start, stop) of each tile along an axis of ``size`` (all in the same unit)."""
    if size <= tile:
        return [(0, size)]
    stride = tile - overlap
    starts = [0]
    while starts[-1] + tile < size:
        starts.append(starts[-1] + stride)
    return [(s, min(s + tile, size)) for s in starts]


def axis_weights(spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """Per tile, float32 weights over its own span: 1 alone, linear ramps where it overlaps
    its neighbour (the later tile rising ``(k + 0.5) / e``), summing to 1 at every position."""
    weights = [np.ones(stop - start, dtype=np.float32) for start, stop in spans]
    for i in range(len(spans) - 1):
        e = spans[i][1] - spans[i + 1][0]
        if e <= 0:
            continue
        rise = ((np.arange(e, dtype=np.float64) + 0.5) / e).astype(np.float32)
        weights[i + 1][:e] = rise
        weights[i][-e:] = np.float32(1.0) - rise
    return weights


def _scaled(spans: list[tuple[int, int]], num: int, den: int) -> list[tuple[int, int]]:
    return [(a * num // den, b * num // den) for a, b in spans]


Network = Callable[[np.ndarray], tuple[np.ndarray, ...]]


def tiled_apply(net: Network, x: np.ndarray, tile: int, overlap: int, num: int, den: int) -> tuple[np.ndarray, ...]:
    """``net`` over overlapping spatial tiles of ``x`` (..., H, W), blended by :func:`axis_weights`.

    ``tile``/``overlap`` are in ``x``'s units; the network maps a span ``[a, b)`` of its input to
    ``[a * num / den, b * num / den)`` of each output (decode 8/1, encode 1/8)."""
    rows, cols = axis_tiles(x.shape[-2], tile, overlap), axis_tiles(x.shape[-1], tile, overlap)
    if len(rows) == 1 and len(cols) == 1:
        return tuple(net(x))
    out_rows, out_cols = _scaled(rows, num, den), _scaled(cols, num, den)
    wr, wc = axis_weights(out_rows), axis_weights(out_cols)
    acc: list[np.ndarray] = []
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            parts = net(np.ascontiguousarray(x[..., r0:r1, c0:c1]))
            (o0, o1), (p0, p1) = out_rows[i], out_cols[j]
            w = wr[i][:, None] * wc[j][None, :]
            if not acc:
                acc = [np.zeros(p.shape[:-2] + (out_rows[-1][1], out_cols[-1][1]), dtype=np.float32) for p in parts]
            for a, p in zip(acc, parts):
                if p.shape[-2:] != (o1 - o0, p1 - p0):
                    raise ValueError(f"tile {r0}:{r1}x{c0}:{c1} gave {p.shape[-2:]}, expected {(o1 - o0, p1 - p0)}")
                a[..., o0:o1, p0:p1] += w * p
    return tuple(acc)


class TiledVAE:
    """A pipeline Backend whose VAE encode and decode run tile by tile (the DiT and everything
    else delegate to ``inner``): the same rule wraps the torch reference and the ncnn graphs."""

    def __init__(self, inner: Any, spec: TileSpec, spatial_factor: int) -> None:
        self.inner, self.spec, self.factor = inner, spec, spatial_factor

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(1, 3, T, H, W) pixels -> blended posterior (mean, logvar) (1, 16, t, h, w)."""
        mean, logvar = tiled_apply(lambda t: tuple(self.inner.encode(t)), x, self.spec.tile, self.spec.overlap,
                                   1, self.factor)
        return mean, logvar

    def decode(self, z: np.ndarray) -> np.ndarray:
        """(1, 16, t, h, w) latent -> blended (1, 3, T, H, W) pixels (unclipped)."""
        f = self.factor
        (x,) = tiled_apply(lambda t: (self.inner.decode(t),), z, self.spec.tile // f, self.spec.overlap // f, f, 1)
        return x

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def tiled(backend: Any, spec: TileSpec | None, spatial_factor: int) -> Any:
    """``backend`` itself when ``spec`` is None, else wrapped in :class:`TiledVAE`."""
    return backend if spec is None else TiledVAE(backend, spec, spatial_factor)
