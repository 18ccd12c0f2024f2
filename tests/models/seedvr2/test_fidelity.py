"""SeedVR2 host pipeline faithful to the official script (projects/inference_seedvr2_3b.py):
colour fix before the clip, torchvision's centre-crop rounding, the posterior sampled, the
official noise draws, official-as-shipped numerics, strict checkpoint configs, .pth weights
through a restricted loader, and the run verb's input/output checks."""

from __future__ import annotations

import argparse
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from ncnnport.models.seedvr2 import model as M
from ncnnport.models.seedvr2.config import TINY
from ncnnport.models.seedvr2.pipeline import (Noise, OfficialBackend, TorchBackend, centre_offset, latent_shape_for,
                                              preprocess, restore, to_uint8, wavelet_color_fix)
from ncnnport.models.seedvr2.port import PORT, check_output, official_record, read_frames


@pytest.fixture(scope="module")
def tiny() -> M.SeedVR2:
    return M.from_preset("tiny", seed=0)


def _video(h: int, w: int, t: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


class OvershootBackend:
    """Fixed networks: zero moments and velocity, a decoder output reaching +-1.6."""

    def __init__(self, dec: np.ndarray) -> None:
        self.dec = dec

    def encode(self, x):
        c, t, h, w = 16, (x.shape[2] - 1) // 4 + 1, x.shape[3] // 8, x.shape[4] // 8
        return np.zeros((1, c, t, h, w), np.float32), np.zeros((1, c, t, h, w), np.float32)

    def dit(self, cond, txt, t, stages):
        return np.zeros(cond.shape[:3] + (16,), np.float32)

    def decode(self, z):
        return self.dec[None]


# --- 1. colour fix on the unclipped decoder output -------------------------------------------
def test_colour_fix_runs_on_the_unclipped_decoder_output() -> None:
    video = _video(64, 64)
    yy, xx = np.meshgrid(np.linspace(0, 1, 64), np.linspace(0, 1, 64), indexing="ij")
    dec = np.stack([1.6 * np.sin(9 * xx), 1.6 * np.cos(7 * yy), 1.2 * np.sin(5 * (xx + yy))])[:, None].astype(np.float32)
    assert np.abs(dec).max() > 1.5                               # overshoots [-1, 1]
    res = restore(TINY, OvershootBackend(dec), video, np.zeros((7, 96), np.float32))
    x = preprocess(video, 64 * 64)
    official = to_uint8(wavelet_color_fix(dec, x))               # fix, then clip (in to_uint8)
    clipped_first = to_uint8(wavelet_color_fix(np.clip(dec, -1, 1), x))
    assert np.array_equal(res.frames, official)
    assert (res.frames != clipped_first).mean() > 0.05           # the old order changes many bytes
    assert np.array_equal(res.stages["decoded"], dec)            # the record keeps the raw output


# --- 2. centre crop offset as torchvision's center_crop --------------------------------------
def test_centre_offset_rounds_half_to_even_like_torchvision() -> None:
    # torchvision: int(round((size - crop) / 2.0)); floor differs for margins 3, 7, 11, 15
    expected = {0: 0, 1: 0, 2: 1, 3: 2, 5: 2, 7: 4, 9: 4, 11: 6, 13: 6, 15: 8}
    assert {m: centre_offset(100 + m, 100) for m in expected} == expected


def test_four_by_three_input_at_the_720p_area_crops_like_the_official() -> None:
    video = _video(480, 640)                                     # 4:3 -> 831x1109 at 720*1280
    x = preprocess(video, 720 * 1280)
    assert x.shape == (3, 1, 816, 1104)
    t = torch.from_numpy(video).permute(0, 3, 1, 2).float() / 255.0
    r = F.interpolate(t, size=(831, 1109), mode="bicubic", align_corners=False, antialias=True).clamp(0, 1)
    top, left = 8, 2                                             # round(15/2)=8 (floor: 7), round(5/2)=2
    want = (r[:, :, top:top + 816, left:left + 1104] * 2 - 1).permute(1, 0, 2, 3).numpy()
    assert np.array_equal(x, want)


# --- 3/4. posterior sampled; the official noise draws -----------------------------------------
def test_seeded_noise_replays_the_official_draw_order_layout_and_dtype() -> None:
    shape = (16, 2, 3, 5)
    noise = Noise.seeded(shape, 666)
    # the official sequence with the process-wide generator: set_seed -> posterior
    # randn_tensor(mean.shape) in the VAE dtype -> randn_like(permuted latent view)
    torch.manual_seed(666)
    post = torch.randn((1, *shape), dtype=torch.bfloat16)
    latent_view = torch.zeros((1, *shape), dtype=torch.bfloat16).permute(0, 2, 3, 4, 1)[0]
    x_T = torch.randn_like(latent_view)
    assert np.array_equal(noise.posterior, post[0].float().numpy())
    assert np.array_equal(noise.x_T, x_T.permute(3, 0, 1, 2).float().numpy())
    rec = noise.record()
    assert rec["seed"] == 666 and rec["shape"] == list(shape) and rec["posterior"] == "sample"
    assert rec["dtype"] == "bfloat16" and len(rec["sha256"]) == 64
    assert Noise.seeded(shape, 666).record() == rec and Noise.seeded(shape, 667).record() != rec
    mean_only = Noise.seeded(shape, 666, sample_posterior=False)
    assert mean_only.posterior is None and mean_only.record()["posterior"] == "mean"


def test_restore_samples_the_posterior_by_default(tiny: M.SeedVR2) -> None:
    video = _video(32, 48)
    be = TorchBackend(tiny.dit, tiny.vae)
    txt = tiny.text.numpy()
    sampled = restore(tiny.config, be, video, txt, seed=3)
    mean = restore(tiny.config, be, video, txt, seed=3, sample_posterior=False)
    m, lv = sampled.stages["posterior_mean"], sampled.stages["posterior_logvar"]
    sc = tiny.config.vae.scaling_factor
    np.testing.assert_allclose(mean.stages["latent"], m[0] * sc, rtol=0, atol=0)
    want = (m[0] + np.exp(0.5 * lv[0]) * sampled.noise.posterior) * sc
    np.testing.assert_allclose(sampled.stages["latent"], want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(sampled.stages["latent"], mean.stages["latent"])
    assert latent_shape_for(tiny.config, video, 32 * 48) == sampled.noise.x_T.shape


def test_run_arguments_default_to_the_official_seed_and_sampling() -> None:
    p = argparse.ArgumentParser()
    PORT.add_run_arguments(p)
    a = p.parse_args(["--input", "a.png", "--output", "b.png"])
    assert (a.seed, a.posterior, a.noise_device) == (666, "sample", "cpu")
    assert p.parse_args(["--input", "a.png", "--output", "b.png", "--posterior", "mean"]).posterior == "mean"


# --- 5. official-as-shipped numerics ----------------------------------------------------------
def test_official_backend_runs_bf16_attention_and_vae_and_is_close(tiny: M.SeedVR2) -> None:
    video = _video(32, 48)
    txt = tiny.text.numpy()
    fp32 = restore(tiny.config, TorchBackend(tiny.dit, tiny.vae), video, txt, seed=1)
    off_be = OfficialBackend(tiny.dit, tiny.vae)
    off = restore(tiny.config, off_be, video, txt, fp32.noise)
    assert next(off_be.vae.parameters()).dtype == torch.bfloat16
    assert next(tiny.vae.parameters()).dtype == torch.float32           # the fp32 reference is untouched
    assert all(m.attn_dtype is None for m in tiny.dit.modules() if hasattr(m, "attn_dtype"))
    bits = off.stages["latent"].view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)                                   # held in bf16 like the official
    d = np.abs(off.stages["velocity"] - fp32.stages["velocity"]).max()
    assert 0 < d < 0.1 * np.abs(fp32.stages["velocity"]).max()
    rec = official_record("fx", off.frames, fp32.frames, PORT_TOL, {"noise": fp32.noise.record()})
    assert rec["gated"] is False and rec["passed"] is True and rec["stage"] == "frames:official_as_shipped"
    assert rec["compares"] == "ncnn fp32 vs official-as-shipped" and "would_pass" in rec


def _tol():
    from ncnnport.contract import Tolerance

    return Tolerance(0.99999, 0.0, 1.0)


PORT_TOL = _tol()


def test_attention_dtype_casts_qkv_only_inside_the_context(tiny: M.SeedVR2) -> None:
    from ncnnport.models.seedvr2.dit import attention_dtype

    vid = torch.randn(1, 8, 8, 33, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = tiny.dit(vid, tiny.text, 1000.0)
        with attention_dtype(tiny.dit, torch.bfloat16):
            cast = tiny.dit(vid, tiny.text, 1000.0)
        again = tiny.dit(vid, tiny.text, 1000.0)
    assert torch.equal(ref, again) and not torch.equal(ref, cast)
    assert (ref - cast).abs().max() < 0.05 * ref.abs().max()


# --- 9. strict checkpoint config --------------------------------------------------------------
@pytest.mark.parametrize("section,field", [("dit", "rope_theta"), ("dit", "norm_eps"), ("dit", "window_area"),
                                           ("vae", "norm_eps"), ("", "timestep")])
def test_checkpoint_config_missing_field_is_an_error_naming_it(tiny: M.SeedVR2, tmp_path, section, field) -> None:
    M.save(tiny, tmp_path / "ck")
    path = tmp_path / "ck" / "config.json"
    meta = json.loads(path.read_text())
    (meta["config"][section] if section else meta["config"]).pop(field)
    path.write_text(json.dumps(meta))
    name = f"{section}.{field}" if section else field
    with pytest.raises(ValueError, match=rf"config\.json: config field {name} is missing"):
        M.load(tmp_path / "ck")
    with pytest.raises(ValueError, match=rf"{tmp_path}.*config field {name} is missing"):
        PORT.load("tiny", tmp_path / "ck")


# --- 15. official .pth weights -----------------------------------------------------------------
def _pth_folder(tiny: M.SeedVR2, root: Path) -> Path:
    ck = root / "official"
    M.save(tiny, ck)
    for part in ("dit", "vae"):
        (ck / f"{part}.safetensors").unlink()
    torch.save(tiny.dit.state_dict(), ck / "seedvr2_ema_3b.pth")
    torch.save(tiny.vae.state_dict(), ck / "ema_vae.pth")
    return ck


def test_pth_checkpoint_converts_once_with_a_receipt_and_loads_strictly(tiny, tmp_path, monkeypatch) -> None:
    from ncnnport.fsutil import sha256_file

    ck = _pth_folder(tiny, tmp_path)
    monkeypatch.chdir(tmp_path)
    loaded = PORT.load("tiny", ck)
    sd = loaded.reference.dit.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in tiny.dit.state_dict().items())
    out = next((tmp_path / "build" / "seedvr2" / "checkpoints").iterdir())
    receipt = json.loads((out / "receipt.json").read_text())["converted"]
    dit = receipt["dit"]
    assert dit["source"] == str((ck / "seedvr2_ema_3b.pth").resolve())
    assert dit["size"] == (ck / "seedvr2_ema_3b.pth").stat().st_size
    assert dit["sha256"] == sha256_file(ck / "seedvr2_ema_3b.pth")
    assert dit["tensors"] == len(tiny.dit.state_dict()) and (out / "dit.safetensors").is_file()
    stamp = (out / "dit.safetensors").stat().st_mtime_ns
    PORT.load("tiny", ck)                                       # converted once: not rewritten
    assert (out / "dit.safetensors").stat().st_mtime_ns == stamp


class _Marker:
    """A pickle that would create a file if unpickled with a permissive loader."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


@pytest.mark.parametrize("payload,match", [
    ("malicious", "restricted loader"),
    ("legacy-malicious", "restricted loader"),
    ({"w": torch.zeros(2), "step": 3}, "step is a int, not a tensor"),
    ({"w": torch.zeros(2), "ids": torch.zeros(2, dtype=torch.int64)}, "ids has dtype torch.int64"),
    ({"model": {"w": torch.zeros(2)}}, "model is a dict"),
    (torch.zeros(3), "expected a flat mapping"),
])
def test_pth_restricted_loader_refuses_anything_but_floating_tensors(tiny, tmp_path, monkeypatch, payload,
                                                                     match) -> None:
    ck = _pth_folder(tiny, tmp_path)
    marker = tmp_path / "pwned"
    if payload == "malicious":
        torch.save({"w": _Marker(marker)}, ck / "seedvr2_ema_3b.pth")
    elif payload == "legacy-malicious":
        with open(ck / "seedvr2_ema_3b.pth", "wb") as f:
            pickle.dump({"w": _Marker(marker)}, f, protocol=2)
    else:
        torch.save(payload, ck / "seedvr2_ema_3b.pth")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=match) as e:
        PORT.load("tiny", ck)
    assert "seedvr2_ema_3b.pth" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


# --- run verb: inputs and outputs --------------------------------------------------------------
def test_validate_inputs_names_the_bad_file(tmp_path, monkeypatch) -> None:
    good = tmp_path / "ok.png"
    Image.fromarray(_video(20, 30)[0]).save(good)
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    (tmp_path / "clip.mp4").write_bytes(b"\0" * 64)
    big = tmp_path / "big.png"
    Image.fromarray(_video(40, 40)[0]).save(big)
    PORT.validate_inputs([good])
    cases = {tmp_path / "missing.png": "no such file", tmp_path / "dir.png": "is a directory",
             tmp_path / "broken.png": "cannot decode", tmp_path / "clip.mp4": "not an image"}
    for path, match in cases.items():
        with pytest.raises(ValueError, match=match) as e:
            PORT.validate_inputs([good, path])
        assert str(path) in str(e.value)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)      # 1600 px: warning (< 2x) -> error
    with pytest.raises(ValueError, match="decompression bomb") as e:
        PORT.validate_inputs([big])
    assert str(big) in str(e.value)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)       # > 2x: PIL's own error, same message
    with pytest.raises(ValueError, match="decompression bomb"):
        read_frames(big)


def test_run_output_is_never_the_input_or_inside_it_and_never_mixed(tmp_path) -> None:
    img = tmp_path / "in.png"
    Image.fromarray(_video(20, 30)[0]).save(img)
    frames = tmp_path / "frames"
    frames.mkdir()
    Image.fromarray(_video(20, 30)[0]).save(frames / "0.png")
    with pytest.raises(ValueError, match="is the --input itself"):
        check_output(img, img)
    with pytest.raises(ValueError, match="inside --input"):
        check_output(frames, frames / "out")
    old = tmp_path / "old"
    old.mkdir()
    (old / "frame_00099.png").write_bytes(b"x")
    with pytest.raises(ValueError, match="not empty"):
        check_output(frames, old)
    with pytest.raises(ValueError, match="is a folder"):
        check_output(img, old)
    check_output(frames, tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check_output(frames, tmp_path / "empty")
    check_output(img, tmp_path / "out.png")
    p = argparse.ArgumentParser()
    PORT.add_run_arguments(p)
    with pytest.raises(ValueError, match="inside --input"):
        PORT.validate_run_args(p.parse_args(["--input", str(frames), "--output", str(frames / "x")]))


def test_load_leaves_the_process_thread_count_alone() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        PORT.load("tiny", None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_to_uint8_uses_the_official_float32_arithmetic() -> None:
    """Official: ``clip(-1, 1).mul(0.5).add(0.5).mul(255).round()`` in float32. These inputs round
    one level apart under the folded ``x * 127.5 + 127.5``."""
    from ncnnport.models.seedvr2.pipeline import to_uint8

    x = np.array([0.737254798412323, 0.36862748861312866, -0.9098039269447327, 1.7, -3.0],
                 dtype=np.float32).reshape(1, 1, 1, 5).repeat(3, axis=0)
    want = np.rint((np.clip(x[0, 0, 0], -1, 1) * np.float32(0.5) + np.float32(0.5)) * np.float32(255))
    assert want.tolist() == [222.0, 175.0, 11.0, 255.0, 0.0]
    assert to_uint8(x)[0, 0, :, 0].tolist() == want.tolist()
