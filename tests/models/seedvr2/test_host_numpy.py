"""The numpy host steps a torch-free SeedVR2 run needs, measured against the torch ones the run
path uses: the wavelet colour fix is bit-exact in float32; the antialiased bicubic resize is
bit-exact when upscaling and within 2 float32 ulp when downscaling. The rest of the
torch-free host (preprocessing without a resize, RoPE and timestep tables from the packaged
lookup, bf16 rounding of numpy draws) equals the torch run path byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ncnnport.models.seedvr2 import host as HOST
from ncnnport.models.seedvr2 import host_numpy as H
from ncnnport.models.seedvr2 import pipeline as P


def _torch_resize(x: np.ndarray, nh: int, nw: int, channels_last: bool) -> np.ndarray:
    t = torch.from_numpy(x)
    if channels_last:  # the run path's layout: a permuted view of (T, H, W, 3) memory
        t = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).permute(0, 3, 1, 2)
    return F.interpolate(t, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True).numpy()


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("h, w, nh, nw", [(64, 96, 256, 384), (5, 7, 48, 67), (480, 640, 720, 960),
                                          (48, 64, 90, 120), (100, 100, 101, 99), (360, 640, 720, 1280)])
def test_upscaling_resize_is_bit_exact_with_torch_antialias_bicubic(h, w, nh, nw, channels_last):
    """Upscaling (SeedVR2's super-resolution case): the same bytes as ATen, which the previous
    unfused Horner/accumulation order missed in 45-86 % of values."""
    x = np.random.default_rng(h * w).random((1, 3, h, w), dtype=np.float32)
    got = H.resize_bicubic_aa(x, nh, nw)
    assert got.dtype == np.float32 and np.array_equal(got, _torch_resize(x, nh, nw, channels_last))


@pytest.mark.parametrize("h, w, nh, nw", [(200, 300, 131, 197), (256, 448, 64, 112), (448, 256, 224, 128),
                                          (1080, 1920, 720, 1280)])
def test_downscaling_resize_is_within_two_ulp_of_torch(h, w, nh, nw):
    """Downscaling (8+ taps): ATen's accumulation order there is not reproduced; measured
    within 2 float32 ulp of [0, 1] values."""
    x = np.random.default_rng(h * w).random((1, 3, h, w), dtype=np.float32)
    got = H.resize_bicubic_aa(x, nh, nw)
    ref = _torch_resize(x, nh, nw, True)
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 2.4e-7


def test_resize_weights_sum_to_one_and_downscaling_widens_the_support():
    idx, w = H.aa_weights(448, 64)  # 7x down: 2 x 7 taps each side
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6) and w.shape[1] >= 28
    assert H.aa_weights(64, 256)[1].shape[1] <= 5  # upscaling: the 4-tap cubic


@pytest.mark.parametrize("h, w", [(64, 96), (256, 448)])
def test_colour_fix_is_bit_exact_with_torch_in_float32(h, w):
    rng = np.random.default_rng(h)
    out = rng.uniform(-1.1, 1.1, (3, 2, h, w)).astype(np.float32)
    src = rng.uniform(-1.0, 1.0, (3, 2, h, w)).astype(np.float32)
    assert np.array_equal(H.wavelet_color_fix(out, src), P.wavelet_color_fix(out, src))


# --- the torch-free host: same bytes as the torch run path -------------------------------------
def _old_torch_preprocess(frames: np.ndarray, area: int, multiple: int = 16) -> np.ndarray:
    """The torch preprocessing the run path had before the host flow moved to numpy (kept here
    as the reference the split must reproduce byte for byte)."""
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 255.0
    nh, nw = P.area_size(x.shape[2], x.shape[3], area)
    if (nh, nw) != tuple(x.shape[2:]):
        x = F.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)
    x = x.clamp(0.0, 1.0)
    ch, cw = nh - nh % multiple, nw - nw % multiple
    top, left = P.centre_offset(nh, ch), P.centre_offset(nw, cw)
    x = x[:, :, top:top + ch, left:left + cw]
    pad = (-(x.shape[0] - 1)) % 4
    if pad:
        x = torch.cat([x, x[-1:].expand(pad, -1, -1, -1)], dim=0)
    return (x * 2.0 - 1.0).permute(1, 0, 2, 3).contiguous().numpy()


@pytest.mark.parametrize("t, h, w, area", [(1, 64, 96, 64 * 96), (2, 70, 99, 70 * 99), (1, 100, 150, 96 * 144),
                                           (3, 37, 53, 64 * 96), (1, 40, 72, 720 * 1280)])
def test_preprocess_split_keeps_the_torch_bytes_and_numpy_matches_them_unless_downscaling(t, h, w, area):
    frames = np.random.default_rng(h).integers(0, 256, (t, h, w, 3), dtype=np.uint8)
    old = _old_torch_preprocess(frames, area)
    assert np.array_equal(P.preprocess(frames, area), old)
    got = HOST.preprocess(frames, area)  # numpy resize
    resized = P.area_size(h, w, area) != (h, w)
    assert got.shape == old.shape and got.dtype == np.float32
    if resized and P.area_size(h, w, area)[0] < h:
        assert np.abs(got - old).max() <= 5e-7  # the downscale's 2 ulp, doubled by x * 2 - 1
    else:  # no resize, or an upscale
        assert np.array_equal(got, old)


@pytest.mark.parametrize("preset", ["tiny", "real"])
def test_packaged_trig_tables_give_the_torch_geometry_bit_for_bit(preset):
    """RoPE tables from the packaged lookup equal torch's cos/sin for every window plan (np.cos
    differs from torch's in ~17 % of values, so a numpy formula could not), and so does the
    timestep sinusoid; positions past the table are one clear error."""
    import io

    from ncnnport.models.seedvr2.config import PRESETS
    from ncnnport.models.seedvr2.describe import host_tables_npz, rope_table_positions
    from ncnnport.models.seedvr2.runner import DiTGeometry

    cfg = PRESETS[preset]
    with np.load(io.BytesIO(host_tables_npz(cfg)), allow_pickle=False) as z:
        tables = H.TrigTables(z["rope_cos"], z["rope_sin"], cfg.timestep, z["sinusoid"], "host_tables.npz")
    torch_geo, table_geo = DiTGeometry(cfg), DiTGeometry(cfg, tables)
    L = cfg.text_len
    for grid in [(1, 4, 6), (3, 16, 28), (2, 45, 80), (1, 21, 21)]:
        for shifted in (False, True):
            a, b = torch_geo.plan(grid, shifted, L), table_geo.plan(grid, shifted, L)
            assert np.array_equal(a.cos_v, b.cos_v) and np.array_equal(a.sin_v, b.sin_v), (grid, shifted)
    assert all(np.array_equal(x, y) for x, y in zip(torch_geo.text_tables(L), table_geo.text_tables(L)))
    assert np.array_equal(tables.timestep_sinusoid(cfg.timestep), torch_geo.trig.timestep_sinusoid(cfg.timestep))
    with pytest.raises(ValueError, match="host_tables.npz: RoPE position .* outside the packaged table"):
        tables.angles(np.array([[rope_table_positions(cfg), 0, 0]]))
    with pytest.raises(ValueError, match="host_tables.npz: holds the sinusoid of timestep"):
        tables.timestep_sinusoid(cfg.timestep / 2)


@pytest.mark.parametrize("preset", ["tiny", "real"])
def test_rope_rows_equal_the_reference_pair_tables(preset):
    from ncnnport.models.seedvr2.config import PRESETS
    from ncnnport.models.seedvr2.mmrope import MMRoPE3d
    from ncnnport.models.seedvr2.runner import TorchTrig

    d = PRESETS[preset].dit
    pos = np.random.default_rng(1).integers(0, 90, (57, 3))
    want = MMRoPE3d(d.head_dim, d.rope_axis_dim, d.rope_theta).tables(torch.from_numpy(pos))
    got = H.rope_rows(*TorchTrig(PRESETS[preset]).angles(pos), d.head_dim)
    assert np.array_equal(got[0], want[0].numpy()) and np.array_equal(got[1], want[1].numpy())


def test_bf16_round_is_torchs_bfloat16_cast():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 3
    x[:4] = [0.0, -0.0, 1.00390625, 1.01171875]  # exact ties round to even
    assert np.array_equal(H.bf16_round(x), torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_numpy_noise_is_deterministic_bf16_and_differs_from_the_torch_stream():
    shape = (16, 1, 4, 6)
    a, b = HOST.numpy_noise(shape, 666), HOST.numpy_noise(shape, 666)
    assert np.array_equal(a.x_T, b.x_T) and np.array_equal(a.posterior, b.posterior)
    assert a.x_T.shape == shape and np.array_equal(a.x_T, H.bf16_round(a.x_T)) and a.device == "numpy"
    assert not np.array_equal(a.x_T, P.Noise.seeded(shape, 666).x_T)
    assert HOST.numpy_noise(shape, 666, sample_posterior=False).posterior is None


def test_read_noise_names_the_file_and_the_problem(tmp_path):
    good = tmp_path / "n.npz"
    np.savez(good, x_T=np.zeros((16, 1, 2, 3), np.float32), posterior=np.ones((16, 1, 2, 3), np.float32))
    n = HOST.read_noise(good, (16, 1, 2, 3))
    assert n.posterior is not None and n.record()["posterior"] == "sample"
    with pytest.raises(ValueError, match=r"n.npz: array 'x_T' has shape \[16, 1, 2, 3\], this input's latent is"):
        HOST.read_noise(good, (16, 1, 4, 6))
    bad = tmp_path / "b.npz"
    np.savez(bad, x_T=np.zeros((2,), np.float64))
    with pytest.raises(ValueError, match="b.npz: array 'x_T' is float64, expected float32"):
        HOST.read_noise(bad)
    np.savez(bad, noise=np.zeros((2,), np.float32))
    with pytest.raises(ValueError, match="b.npz: needs array 'x_T'"):
        HOST.read_noise(bad)
    (tmp_path / "t.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="t.npz: not a readable .npz"):
        HOST.read_noise(tmp_path / "t.npz")


def test_judge_frames_passes_equal_bytes_and_gates_a_one_level_difference():
    from ncnnport.contract import Tolerance
    from ncnnport.models.seedvr2.packaged import judge_frames

    want = np.random.default_rng(0).integers(30, 220, (1, 32, 48, 3), dtype=np.uint8)
    tol = Tolerance(min_cosine=0.9999, max_abs_rel=0.0, max_abs_floor=1.0)
    assert judge_frames(want.copy(), want, tol) == (True, judge_frames(want, want, tol)[1])
    assert "bytes equal" in judge_frames(want, want, tol)[1]
    one = want.copy()
    one[0, 3, 4, 1] += 1
    ok, detail = judge_frames(one, want, tol)
    assert ok and "differ in 1 of 4608 bytes, max 1 level(s)" in detail
    one[0, 5, 5, 2] += 3
    ok, detail = judge_frames(one, want, tol)
    assert not ok and "max 3 level(s)" in detail
