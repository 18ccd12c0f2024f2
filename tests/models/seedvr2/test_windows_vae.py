"""Window partition facts (regular, shifted, edge windows) and VAE frame/shape facts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.models.seedvr2 import model as M
from ncnnport.models.seedvr2.pipeline import preprocess
from ncnnport.models.seedvr2.vae import latent_frames, video_frames
from ncnnport.models.seedvr2.windows import (axis_intervals, partition, window_sizes,
                                             window_token_index)

torch.set_num_threads(1)


def _sizes(intervals):
    return [b - a for a, b in intervals]


def test_edge_windows_40x45() -> None:
    assert window_sizes((1, 40, 45)) == (1, 19, 22)
    assert _sizes(axis_intervals(40, 19, False)) == [19, 19, 2]
    assert _sizes(axis_intervals(45, 22, False)) == [22, 22, 1]
    # shifted by half a window: tiny first and last intervals
    assert axis_intervals(40, 19, True) == [(0, 9), (9, 28), (28, 40)]
    assert axis_intervals(45, 22, True) == [(0, 11), (11, 33), (33, 45)]
    assert len(partition((1, 40, 45), False)) == 9 and len(partition((1, 40, 45), True)) == 9


def test_720p_grid_counts() -> None:
    assert window_sizes((1, 45, 80)) == (1, 15, 27)
    assert len(partition((1, 45, 80), False)) == 9
    assert len(partition((1, 45, 80), True)) == 16


def test_small_grids_have_one_window() -> None:
    for grid in ((1, 4, 4), (1, 16, 16), (1, 20, 20)):
        assert len(partition(grid, False)) == 1 and len(partition(grid, True)) == 1


def test_window_size_uses_half_to_even_rounding() -> None:
    # 25x576 grid: scale sqrt(3600/14400) = 0.5 exactly, 25*0.5 = 12.5 -> round() = 12 -> wh 4
    # (round-half-up would give 13 -> wh 5).
    assert window_sizes((1, 25, 576)) == (1, 4, 96)


def test_time_windows() -> None:
    assert window_sizes((3, 8, 8))[0] == 1
    assert axis_intervals(3, 1, True) == [(0, 1), (1, 2), (2, 3)]  # empty first interval dropped
    assert window_sizes((40, 8, 8))[0] == 8                          # min(t, 30) / 4 -> ceil 7.5
    assert axis_intervals(9, 3, True) == [(0, 1), (1, 4), (4, 7), (7, 9)]


@pytest.mark.parametrize("grid", [(1, 40, 45), (1, 16, 28), (3, 21, 21), (5, 45, 80), (2, 9, 30)])
@pytest.mark.parametrize("shifted", [False, True])
def test_partition_covers_every_token_once(grid, shifted) -> None:
    wins = partition(grid, shifted)
    idx = np.concatenate(window_token_index(grid, wins))
    assert np.array_equal(np.sort(idx), np.arange(int(np.prod(grid))))
    # iteration order: w outermost, t innermost; raster order inside each window
    first = window_token_index(grid, wins[:1])[0]
    assert np.all(np.diff(first) > 0)
    if len(wins) > 1 and wins[0][0] != wins[1][0]:
        assert wins[0][2] == wins[1][2] and wins[0][1] == wins[1][1]


def test_shifted_non_square_grid_has_edge_windows() -> None:
    wins = partition((1, 16, 28), True)
    sizes = sorted({(w[1].stop - w[1].start, w[2].stop - w[2].start) for w in wins})
    assert window_sizes((1, 16, 28)) == (1, 15, 27)
    assert sizes == [(7, 13), (7, 15), (9, 13), (9, 15)]


def test_frame_count_helpers() -> None:
    assert [latent_frames(t) for t in (1, 5, 9, 17)] == [1, 2, 3, 5]
    assert [video_frames(n) for n in (1, 2, 3, 5)] == [1, 5, 9, 17]
    with pytest.raises(ValueError):
        latent_frames(6)


@pytest.fixture(scope="module")
def vae():
    return M.from_preset("tiny", seed=0).vae


@pytest.mark.parametrize("frames,latents", [(1, 1), (5, 2), (9, 3)])
def test_vae_frame_counts(vae, frames, latents) -> None:
    x = torch.rand(1, 3, frames, 32, 48) * 2 - 1
    with torch.inference_mode():
        mean, logvar = vae.encode_moments(x)
        assert mean.shape == (1, 16, latents, 4, 6) and logvar.shape == mean.shape
        out = vae.decode(mean)
    assert out.shape == (1, 3, frames, 32, 48)


def test_vae_is_causal_and_normalises_per_frame(vae) -> None:
    """Latent frame 0 depends on input frame 0 only: true only with causal head padding AND
    per-frame GroupNorm (a clip-wide GroupNorm mixes later frames into frame 0)."""
    x = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    with torch.inference_mode():
        whole = vae.encode_moments(x)[0]
        first = vae.encode_moments(x[:, :, :1])[0]
        dec_whole = vae.decode(whole)
        dec_first = vae.decode(whole[:, :, :1])
    torch.testing.assert_close(whole[:, :, :1], first, rtol=0, atol=1e-5)
    torch.testing.assert_close(dec_whole[:, :, :1], dec_first, rtol=0, atol=1e-5)
    x2 = x.clone()
    x2[:, :, 8] = -x2[:, :, 8]
    with torch.inference_mode():
        changed = vae.encode_moments(x2)[0]
    torch.testing.assert_close(changed[:, :, :2], whole[:, :, :2], rtol=0, atol=1e-5)
    assert (changed[:, :, 2] - whole[:, :, 2]).abs().max() > 1e-3


def test_upsample_drops_frame_one(vae) -> None:
    """Space-time upsample keeps frame 0 of latent frame 0 only (2f-1 frames)."""
    up = vae.decoder.up_blocks[0].upsamplers[0]
    assert up.temporal
    x = torch.randn(1, up.upscale_conv.in_channels, 2, 3, 3)
    with torch.inference_mode():
        y = up.upscale_conv(x)
        c = x.shape[1]
        # channel (x, y, z, c) = (0, 0, z, 0) at pixel (0, 0) lands at output frame f*2+z
        full = [y[0, z * c, f, 0, 0] for f in range(2) for z in range(2)]
        up_conv, up.conv = up.conv, torch.nn.Identity()  # look at the shuffle alone
        try:
            out = up(x)
        finally:
            up.conv = up_conv
    assert out.shape[2] == 3
    kept = [out[0, 0, i, 0, 0] for i in range(3)]
    assert torch.equal(torch.stack(kept), torch.stack([full[0], full[2], full[3]]))


def test_preprocess_centre_crop_and_frame_padding() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (6, 70, 50, 3), dtype=np.uint8)
    x = preprocess(frames, area=70 * 50)
    assert x.shape == (3, 9, 64, 48)
    want = frames[0, 3:67, 1:49].astype(np.float32) / 255.0 * 2 - 1
    np.testing.assert_allclose(x[:, 0].transpose(1, 2, 0), want, atol=1e-6)
    assert np.array_equal(x[:, 8], x[:, 5]) and np.array_equal(x[:, 6], x[:, 5])
    assert preprocess(frames[:1], area=4 * 70 * 50).shape == (3, 1, 128, 96)  # area upscale
