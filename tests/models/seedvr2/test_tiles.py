"""The opt-in VAE tiling rule (models/seedvr2/tiles.py): tile grid, blend weights, the
wrapper over any backend, option checks, and the tiled-vs-untiled distance of the tiny VAE."""

from __future__ import annotations

import numpy as np
import pytest

from ncnnport.models.seedvr2.tiles import (TiledVAE, TileSpec, axis_tiles, axis_weights, tile_spec, tiled,
                                           tiled_apply)


@pytest.mark.parametrize("size,tile,overlap,expected", [
    (90, 64, 16, [(0, 64), (48, 90)]),                 # 720p latent rows at 512 px tiles
    (160, 64, 16, [(0, 64), (48, 112), (96, 160)]),    # 720p latent columns
    (64, 64, 16, [(0, 64)]),                           # fits: one tile, no sliver of overlap only
    (40, 64, 16, [(0, 40)]),
    (65, 64, 16, [(0, 64), (48, 65)]),
    (100, 32, 0, [(0, 32), (32, 64), (64, 96), (96, 100)]),
])
def test_axis_tiles_cover_the_axis_and_overlap_by_exactly_the_overlap(size, tile, overlap, expected) -> None:
    spans = axis_tiles(size, tile, overlap)
    assert spans == expected
    assert spans[0][0] == 0 and spans[-1][1] == size
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 - b0 == overlap                      # consecutive tiles share exactly the overlap
        assert b1 - b0 > overlap                       # no tile is overlap only
    for (a0, a1), (c0, c1) in zip(spans, spans[2:]):
        assert c0 >= a1                                # never three tiles on one position


def test_axis_weights_ramp_linearly_and_sum_to_one() -> None:
    spans = [(0, 64), (48, 112), (96, 160)]
    w = axis_weights(spans)
    total = np.zeros(160, dtype=np.float64)
    for (a, b), wi in zip(spans, w):
        total[a:b] += wi
    np.testing.assert_allclose(total, 1.0, atol=1e-7)
    np.testing.assert_allclose(w[1][:16], (np.arange(16) + 0.5) / 16, atol=1e-7)
    assert np.all(w[0][:48] == 1.0) and np.all(w[1][16:48] == 1.0)


def _upsample(factor: int):
    """A stand-in decoder whose output maps span [a, b) to [a * f, b * f) exactly."""
    return lambda x: (np.repeat(np.repeat(x, factor, axis=-2), factor, axis=-1) * np.float32(2.0),)


def test_tiled_apply_of_a_local_network_equals_the_untiled_one() -> None:
    """A network without context (nearest upsample) must come out unchanged: catches a wrong
    offset, a wrong scale or weights that do not sum to one (corners included)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((1, 4, 2, 30, 45)).astype(np.float32)
    (whole,) = _upsample(8)(z)
    (tiled_out,) = tiled_apply(_upsample(8), z, 16, 4, 8, 1)
    assert tiled_out.shape == whole.shape
    np.testing.assert_allclose(tiled_out, whole, rtol=1e-6, atol=1e-6)


def test_tiled_apply_of_a_downsampling_network_equals_the_untiled_one() -> None:
    def pool(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h, w = x.shape[-2] // 8, x.shape[-1] // 8
        m = x.reshape(x.shape[:-2] + (h, 8, w, 8)).mean(axis=(-3, -1))
        return m, -m
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 3, 1, 16 * 13, 16 * 7)).astype(np.float32)
    a, b = tiled_apply(pool, x, 64, 16, 1, 8)
    ra, rb = pool(x)
    np.testing.assert_allclose(a, ra, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, rb, rtol=1e-5, atol=1e-6)


def test_a_frame_within_one_tile_is_not_tiled() -> None:
    calls = []

    def net(x: np.ndarray) -> tuple[np.ndarray]:
        calls.append(x.shape)
        return (x * 3,)
    x = np.ones((1, 3, 1, 64, 48), dtype=np.float32)
    (y,) = tiled_apply(net, x, 64, 16, 1, 1)
    assert calls == [x.shape] and np.array_equal(y, x * 3)


class _Recorder:
    """A backend that records its VAE calls' spatial shapes and shows a local response."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.shapes.append(x.shape[-2:])
        h, w = x.shape[-2] // 8, x.shape[-1] // 8
        m = x[:, :1, :, ::8, ::8][..., :h, :w].repeat(16, axis=1)
        return m, m * 0

    def decode(self, z: np.ndarray) -> np.ndarray:
        self.shapes.append(z.shape[-2:])
        return np.repeat(np.repeat(z[:, :3], 8, axis=-2), 8, axis=-1)

    def dit(self, *args: object) -> str:
        return "dit"


def test_tiled_backend_runs_tile_sized_vae_calls_and_delegates_the_dit() -> None:
    inner = _Recorder()
    be = TiledVAE(inner, TileSpec(512, 128), 8)
    z = np.zeros((1, 16, 1, 90, 160), dtype=np.float32)   # a 720p latent
    assert be.decode(z).shape == (1, 3, 1, 720, 1280)
    assert inner.shapes == [(64, 64), (64, 64), (64, 64), (42, 64), (42, 64), (42, 64)]
    inner.shapes.clear()
    m, lv = be.encode(np.zeros((1, 3, 1, 720, 1280), dtype=np.float32))
    assert m.shape == lv.shape == (1, 16, 1, 90, 160)
    assert max(h for h, _ in inner.shapes) == 512 and max(w for _, w in inner.shapes) == 512
    assert be.dit() == "dit"
    assert tiled(inner, None, 8) is inner


@pytest.mark.parametrize("tile,overlap,message", [
    (None, 64, "--vae-overlap needs --vae-tile"),
    (100, None, "--vae-tile 100: must be a multiple of 8"),
    (8, None, "at least 16"),
    (256, 12, "--vae-overlap 12: must be a multiple of 8"),
    (256, 136, "half the tile (128)"),
    (256, -8, "--vae-overlap -8"),
])
def test_tile_options_are_refused_in_one_line_naming_the_option(tile, overlap, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tile_spec(tile, overlap, 8)


def test_tile_spec_defaults_to_a_quarter_overlap() -> None:
    assert tile_spec(None, None, 8) is None
    assert tile_spec(512, None, 8) == TileSpec(512, 128)
    assert tile_spec(200, None, 8) == TileSpec(200, 48)
    assert tile_spec(256, 0, 8) == TileSpec(256, 0)


def _run_parser():
    import argparse

    from ncnnport.models.seedvr2.port import PORT

    p = argparse.ArgumentParser()
    PORT.add_run_arguments(p)
    return PORT, p


@pytest.mark.parametrize("extra,message", [
    (["--vae-tile", "100"], "--vae-tile 100"),
    (["--vae-overlap", "32"], "--vae-overlap needs --vae-tile"),
    (["--vae-tile", "256", "--vae-overlap", "200"], "--vae-overlap 200"),
])
def test_run_refuses_bad_tile_options_before_any_model_loads(tmp_path, extra, message) -> None:
    """validate_run_args runs before the model is built (cli.cmd_run): a bad tile is one line."""
    from PIL import Image

    port, p = _run_parser()
    img = tmp_path / "in.png"
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(img)
    args = p.parse_args(["--input", str(img), "--output", str(tmp_path / "out.png"), *extra])
    with pytest.raises(ValueError, match=message):
        port.validate_run_args(args)
    ok = p.parse_args(["--input", str(img), "--output", str(tmp_path / "out.png"), "--vae-tile", "256"])
    port.validate_run_args(ok)
    assert (ok.vae_tile, ok.vae_overlap) == (256, None)
