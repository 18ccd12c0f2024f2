"""Processor resize rule, patch order, positions and the window layout (spec sections 2, 4, 5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.models.youtu_vl.config import ProcessorConfig, tiny_config
from ncnnport.models.youtu_vl.processor import (patch_permutation, patch_positions, patchify,
                                                process_image, resize_normalize, target_size,
                                                window_layout)

from ncnnport.models.youtu_vl.fixtures import synthetic_image


@pytest.mark.parametrize("hw, want", [
    ((1, 1), (32, 32)),            # tiny image: rounded up to one merge block
    ((5, 7), (32, 32)),
    ((180, 270), (192, 288)),      # the spec's 12x18 patch grid
    ((32, 2048), (32, 2048)),      # extreme aspect ratio already on the grid
    ((33, 2049), (64, 2080)),      # sides round UP, never down
    ((224, 224), (224, 224)),
])
def test_target_size_rounds_up_without_downscaling(hw, want):
    assert target_size(*hw) == want


def test_target_size_shrinks_in_steps_when_over_the_cap():
    # 1000 px needs scale <= 0.256 to fit 256 patches (16x16): the first 0.02 step below is 0.24.
    assert target_size(1000, 1000, max_num_patches=256) == (256, 256)
    # scale 0.5 after 25 in-place steps is 0.49999999999999956: 1024*s/32 rounds up to 16, not 17.
    assert target_size(1024, 1024, max_num_patches=1024) == (512, 512)
    h, w = target_size(4000, 300, max_num_patches=1024)
    assert (h // 16) * (w // 16) <= 1024 and h % 32 == 0 and w % 32 == 0
    # one step less would not have fitted: the loop stops at the first scale that fits
    assert (h + 32) // 16 * (w // 16) > 1024 or h // 16 * ((w + 32) // 16) > 1024


def test_image_bigger_than_cap_fits_cap():
    img = synthetic_image(700, 900)
    cfg = tiny_config()
    out = process_image(img, cfg.vision, cfg.processor, max_num_patches=400)
    assert out.num_patches <= 400
    assert out.pixel_values.shape == (out.num_patches, 768)
    assert out.original_hw == (700, 900)


def test_normalisation_maps_0_and_255_to_minus_one_and_one():
    from PIL import Image

    img = Image.fromarray(np.array([[[0, 255, 0], [255, 0, 255]]] * 2, dtype=np.uint8))
    x = resize_normalize(img, (2, 2), ProcessorConfig())
    assert x.shape == (3, 2, 2)
    np.testing.assert_array_equal(x[:, 0, 0], [-1, 1, -1])
    np.testing.assert_array_equal(x[:, 0, 1], [1, -1, 1])


def test_resize_is_antialiased():
    """A 1-px checkerboard downscaled 4x must average to grey (plain bilinear would alias)."""
    from PIL import Image

    board = (np.indices((128, 128)).sum(0) % 2 * 255).astype(np.uint8)
    img = Image.fromarray(np.stack([board] * 3, -1))
    x = resize_normalize(img, (32, 32), ProcessorConfig())
    assert np.abs(x).max() < 0.05


def test_patch_rows_are_merge_block_major_channel_last():
    c, h, w = 3, 64, 96
    chw = np.random.default_rng(0).standard_normal((c, h, w)).astype(np.float32)
    rows = patchify(chw, 16, 2)
    gw = w // 16
    for (y, x, ch) in [(0, 0, 0), (17, 5, 2), (40, 90, 1), (63, 33, 0)]:
        gy, gx, py, px = y // 16, x // 16, y % 16, x % 16
        row = ((gy // 2) * (gw // 2) + gx // 2) * 4 + (gy % 2) * 2 + gx % 2
        assert rows[row, (py * 16 + px) * 3 + ch] == chw[ch, y, x]


def test_positions_match_transformers():
    from transformers.vision_utils import get_vision_position_ids

    for gh, gw in [(12, 18), (2, 128), (34, 20)]:
        ref = get_vision_position_ids(torch.tensor([[1, gh, gw]]), 2).numpy()
        np.testing.assert_array_equal(patch_positions(gh, gw, 2), ref)


def test_window_layout_12x18_from_spec():
    index, cu = window_layout(12, 18, 2, 8)
    want = [r * 9 + c for r in range(6) for c in range(8)] + [8, 17, 26, 35, 44, 53]
    assert index.tolist() == want
    assert cu.tolist() == [0, 192, 216]


def test_window_layout_36x32_and_single_window():
    _, cu = window_layout(36, 32, 2, 8)
    assert cu.tolist() == [0, 256, 512, 768, 1024, 1088, 1152]
    index, cu = window_layout(14, 14, 2, 8)
    assert cu.tolist() == [0, 196] and index.tolist() == list(range(49))


@pytest.mark.parametrize("grid", [(12, 18), (34, 20), (2, 128), (14, 14), (2, 2), (16, 16), (50, 6)])
def test_window_layout_matches_transformers(grid):
    from transformers.vision_utils import get_vision_window_index

    ref_index, ref_cu = get_vision_window_index(torch.tensor([[1, *grid]]), 2, 256, 16)
    index, cu = window_layout(*grid, 2, 8)
    np.testing.assert_array_equal(index, ref_index.numpy())
    np.testing.assert_array_equal(cu, ref_cu.numpy())


def test_inverse_permutation_is_not_the_permutation_beyond_one_window():
    index, _ = window_layout(34, 20, 2, 8)      # 17x10 merged tokens: 3x2 windows
    perm = patch_permutation(index, 4)
    inverse = np.argsort(perm)
    assert not np.array_equal(perm, inverse)    # applying perm twice would be wrong
    x = np.arange(perm.size)
    np.testing.assert_array_equal(x[perm][inverse], x)
    index1, _ = window_layout(16, 16, 2, 8)     # one window: identity, the case that hides bugs
    assert np.array_equal(index1, np.arange(64))
