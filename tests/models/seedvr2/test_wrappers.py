"""Export wrappers + host runner (no pnnx): the split pipeline equals the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.models.seedvr2 import model as M
from ncnnport.models.seedvr2 import specs as S
from ncnnport.models.seedvr2.mmrope import MMRoPE3d, apply_rope
from ncnnport.models.seedvr2.pipeline import Noise, TorchBackend, restore
from ncnnport.models.seedvr2.runner import DiTGeometry, GraphBackend, decode_stage_temporal, torch_runners
from ncnnport.models.seedvr2.windows import partition, window_local_positions, window_token_index
from ncnnport.models.seedvr2.wrappers import depth_to_space, pair_to_half_perm, swap_halves

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    return M.from_preset("tiny", seed=0)


@pytest.fixture(scope="module")
def runners(tiny):
    specs = {s.name: s for s in S.module_specs(tiny)}
    return specs, torch_runners(specs)


def test_split_names_and_dynamic_axes(runners) -> None:
    specs, _ = runners
    names = list(specs)
    assert names[:5] == ["vae_encode", "vae_decode_0", "vae_decode_1", "vae_decode_2", "vae_decode_3"]
    assert {"dit_input", "dit_embedding", "dit_attention", "dit_output"} <= set(names)
    assert [n for n in names if n.startswith("dit_block_")] == [
        f"dit_block_{i:02d}_{p}" for i in range(4) for p in ("pre", "post")]
    for s in specs.values():
        for t in s.inputs + s.outputs:
            assert t.shape[0] == 1 and len(t.shape) <= 5
        assert all(a != b for a, b in s.axes.values())
    # the last block's post graph has no text stream
    assert [t.name for t in specs["dit_block_03_post"].inputs] == ["vid", "emb6", "attn_v"]


def test_every_wrapper_runs_at_every_parity_size(runners) -> None:
    specs, run = runners
    for s in specs.values():
        for sizes in s.all_parity_sizes():
            outs = run[s.name].run(s.example_inputs(sizes))
            assert all(np.isfinite(o).all() for o in outs), s.name


@pytest.mark.parametrize("preset", ["tiny", "real"])
def test_pair_rope_equals_permuted_rotate_half(preset) -> None:
    """Adjacent-pair RoPE on x == swap-halves RoPE with signed sin on x[perm], re-permuted
    (real: head_dim 128, 3 x 42 rotated channels + 2 unrotated)."""
    from ncnnport.models.seedvr2.config import PRESETS
    cfg = PRESETS[preset]
    geo = DiTGeometry(cfg)
    hd = cfg.dit.head_dim
    perm = torch.from_numpy(pair_to_half_perm(hd))
    pos = np.array([[9, 2, 5], [7, 0, 1], [60, 3, 3]])
    cos, sin = MMRoPE3d(hd, cfg.dit.rope_axis_dim, cfg.dit.rope_theta).tables(torch.from_numpy(pos))
    c, s = geo._tables(pos)
    x = torch.randn(3, hd)
    want = apply_rope(x, cos, sin)[:, perm]
    xp = x[:, perm]
    got = xp * torch.from_numpy(c) + swap_halves(xp) * torch.from_numpy(s)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_raster_tables_hold_window_local_positions() -> None:
    from ncnnport.models.seedvr2.config import TINY
    geo = DiTGeometry(TINY)
    grid = (3, 16, 28)
    for shifted in (False, True):
        plan = geo.plan(grid, shifted, text_len=7)
        wins = partition(grid, shifted)
        assert len(plan.index) == len(wins) > 1
        for idx, local in zip(window_token_index(grid, wins), window_local_positions(wins)):
            pos = local.copy()
            pos[:, 0] += 7
            c, _ = geo._tables(pos)
            np.testing.assert_array_equal(plan.cos_v[0, idx], c)


def test_host_depth_to_space_matches_reference_upsample(tiny) -> None:
    for k, temporal in enumerate(decode_stage_temporal(tiny.config)):
        up = tiny.vae.decoder.up_blocks[k].upsamplers[0]
        assert up.temporal == temporal
        x = torch.randn(1, up.upscale_conv.in_channels, 2, 3, 4)
        with torch.inference_mode():
            conv, up.conv = up.conv, torch.nn.Identity()
            try:
                want = up(x).numpy()
            finally:
                up.conv = conv
            got = depth_to_space(up.upscale_conv(x).numpy(), temporal)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(1, 256, 448, 3), (9, 64, 96, 3)])
def test_split_pipeline_equals_reference(tiny, runners, shape) -> None:
    """TorchModule wrappers driven by the host runner (window gathers, RoPE tables, text
    averaging, depth-to-space) reproduce the reference pipeline stage by stage; streamed block
    residency is bit-identical to resident."""
    _, run = runners
    rng = np.random.default_rng(5)
    video = rng.integers(0, 256, shape, dtype=np.uint8)
    txt = tiny.text.numpy()
    a = restore(tiny.config, TorchBackend(tiny.dit, tiny.vae), video, txt, seed=3)
    b = restore(tiny.config, GraphBackend(tiny.config, run.__getitem__), video, txt, seed=3)
    for k in ("latent", "block_00", "block_01", "block_02", "block_03", "vid_out", "velocity", "decoded"):
        ref = a.stages[k]
        assert np.abs(ref - b.stages[k]).max() <= 1e-5 * max(1.0, np.abs(ref).max()), k
    assert np.abs(a.frames.astype(int) - b.frames.astype(int)).max() <= 1
    loaded: list[str] = []
    live: dict[str, object] = {}

    def get(name):
        if name.startswith("dit_block_") and name not in live:
            live[name] = run[name]
            loaded.append(name)
        return live.get(name, run[name])

    c = restore(tiny.config, GraphBackend(tiny.config, get, lambda n: live.pop(n, None), streamed=True),
                video, txt, seed=3)
    assert np.array_equal(b.frames, c.frames) and not live and len(loaded) == 8


@pytest.mark.parametrize("shape,twins", [((1, 256, 448, 3), True), ((9, 64, 96, 3), False)])
def test_image_twins_run_single_frames_only(tiny, runners, shape, twins) -> None:
    """An image (T = 1) runs the VAE's single-frame twins (temporal taps summed) and reproduces
    the reference pipeline; a clip keeps the general graphs."""
    specs, run = runners
    used: list[str] = []

    def get(name):
        used.append(name)
        return run[name]

    rng = np.random.default_rng(5)
    video = rng.integers(0, 256, shape, dtype=np.uint8)
    txt = tiny.text.numpy()
    a = restore(tiny.config, TorchBackend(tiny.dit, tiny.vae), video, txt, seed=3)
    b = restore(tiny.config, GraphBackend(tiny.config, get, has=specs.__contains__), video, txt, seed=3)
    vae_used = [n for n in used if n.startswith("vae_")]
    assert len(vae_used) == 5 and all(n.endswith("_image") for n in vae_used) == twins, vae_used
    assert twins or not any(n.endswith("_image") for n in vae_used)
    for k in ("latent", "decoded"):
        ref = a.stages[k]
        assert np.abs(ref - b.stages[k]).max() <= 1e-5 * max(1.0, np.abs(ref).max()), k
    assert np.abs(a.frames.astype(int) - b.frames.astype(int)).max() <= 1


def test_image_twins_hold_a_third_of_the_temporal_conv_weights(runners) -> None:
    """Every 3x3x3 causal conv of a twin is one 3x3 conv over Cin channels (taps summed), not
    over 3 x Cin (taps concatenated): the traced wrapper's conv weights shrink accordingly."""
    specs, _ = runners
    for name in ("vae_encode", "vae_decode_0", "vae_decode_3"):
        general = specs[name].build()
        twin = specs[name + "_image"].build()
        wg = [m.weight_2d().shape for m in general.modules() if hasattr(m, "weight_2d")]
        wt = [m.weight_2d().shape for m in twin.modules() if hasattr(m, "weight_2d")]
        assert len(wg) == len(wt) > 0
        for g, t in zip(wg, wt):
            kt = g[1] // t[1]
            assert g[0] == t[0] and g[2:] == t[2:] and kt in (1, 3) and g[1] == kt * t[1]
        assert any(g[1] == 3 * t[1] for g, t in zip(wg, wt))


def test_one_step_and_explicit_noise(tiny) -> None:
    """x0 = x_T - v at t = 1000; the posterior mean is used when the noise carries no posterior draw."""
    class Zero(TorchBackend):
        def dit(self, cond, txt, t, stages):
            assert t == 1000.0 and cond.shape[-1] == 33
            np.testing.assert_array_equal(cond[..., 32], 1.0)        # mask channel
            stages["cond"] = cond
            return np.zeros(cond.shape[:3] + (16,), dtype=np.float32)

    video = np.full((1, 64, 64, 3), 128, dtype=np.uint8)
    be = Zero(tiny.dit, tiny.vae)
    noise = Noise.seeded((16, 1, 8, 8), seed=4, sample_posterior=False)
    r = restore(tiny.config, be, video, tiny.text.numpy(), noise)
    np.testing.assert_array_equal(r.stages["x0"], noise.x_T.transpose(1, 2, 3, 0))
    np.testing.assert_array_equal(r.stages["cond"][..., :16], noise.x_T.transpose(1, 2, 3, 0))
    np.testing.assert_allclose(r.stages["cond"][..., 16:32],
                               (r.stages["posterior_mean"][0] * 0.9152).transpose(1, 2, 3, 0), atol=1e-6)
    sampled = restore(tiny.config, be, video, tiny.text.numpy(), Noise.seeded((16, 1, 8, 8), 4, True))
    assert not np.allclose(sampled.stages["latent"], r.stages["latent"])


def test_wavelet_colour_fix_keeps_source_low_frequencies() -> None:
    """A colour cast (constant offset) on the restored frame is replaced by the source's low
    band; identical inputs reconstruct exactly (high + low telescopes back to the frame)."""
    from ncnnport.models.seedvr2.pipeline import wavelet_color_fix

    rng = np.random.default_rng(2)
    src = rng.uniform(-0.8, 0.8, (3, 2, 40, 56)).astype(np.float32)
    np.testing.assert_allclose(wavelet_color_fix(src, src), src, atol=1e-5)
    np.testing.assert_allclose(wavelet_color_fix(src + 0.3, src), src, atol=1e-5)
    detail = rng.standard_normal(src.shape).astype(np.float32) * 0.1
    fixed = wavelet_color_fix(src + detail, src)
    assert np.abs(fixed - src).mean() > 0.01          # high-frequency detail is kept
