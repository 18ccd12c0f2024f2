"""The numpy host steps a torch-free SeedVR2 run needs, measured against the torch ones the run
path uses today: the wavelet colour fix is bit-exact in float32; the antialiased bicubic resize
is within 2e-6 (a few float32 ulp of [0, 1] values, 20-97 % of values bit-identical), not
bit-exact (ATen's weight and accumulation rounding is not reproduced)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ncnnport.models.seedvr2 import host_numpy as H
from ncnnport.models.seedvr2 import pipeline as P


@pytest.mark.parametrize("h, w, nh, nw", [(64, 96, 256, 384), (200, 300, 131, 197), (256, 448, 64, 112),
                                          (5, 7, 48, 67), (480, 640, 720, 960)])
def test_resize_is_within_a_few_ulp_of_torch_antialias_bicubic(h, w, nh, nw):
    x = np.random.default_rng(h * w).random((1, 3, h, w), dtype=np.float32)
    ref = F.interpolate(torch.from_numpy(x), size=(nh, nw), mode="bicubic", align_corners=False,
                        antialias=True).numpy()
    got = H.resize_bicubic_aa(x, nh, nw)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 2e-6


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
