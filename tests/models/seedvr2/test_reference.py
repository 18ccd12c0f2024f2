"""SeedVR2 reference: checkpoint naming/loading, the two official quirks, RoPE layout."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ncnnport.models.seedvr2 import model as M
from ncnnport.models.seedvr2.config import REAL, TINY, SeedVR2Config
from ncnnport.models.seedvr2.dit import NaDiT, rms_norm, timestep_sinusoid
from ncnnport.models.seedvr2.mmrope import MMRoPE3d, apply_rope, text_positions, video_positions
from ncnnport.models.seedvr2.vae import VideoAutoencoderKL

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny() -> M.SeedVR2:
    return M.from_preset("tiny", seed=0)


def test_real_config_matches_official_checkpoint_layout() -> None:
    """Meta-device build (no memory): 635 DiT tensors, 3,391,475,776 parameters + 32x21 rope
    buffers, VAE 250,648,227 parameters, no text copy of block 31's mlp/ada."""
    with torch.device("meta"):
        dit, vae = NaDiT(REAL.dit), VideoAutoencoderKL(REAL.vae)
    sd = dit.state_dict()
    assert len(sd) == 635
    assert sum(p.numel() for p in dit.parameters()) == 3_391_475_776
    freqs = [k for k in sd if k.endswith("attn.rope.rope.freqs")]
    assert len(freqs) == 32 and all(sd[k].shape == (21,) for k in freqs)
    assert sum(p.numel() for p in vae.parameters()) == 250_648_227
    assert "blocks.0.attn.proj_qkv.txt.weight" in sd and "blocks.9.mlp.txt.proj_in.weight" in sd
    assert "blocks.10.attn.proj_qkv.all.weight" in sd and "blocks.10.attn.proj_qkv.vid.weight" not in sd
    assert not any(k.startswith("blocks.31.") and ".txt." in k for k in sd)
    assert sd["vid_in.proj.weight"].shape == (2560, 132) and sd["vid_out.proj.weight"].shape == (64, 2560)
    assert sd["emb_in.proj_out.weight"].shape == (15360, 2560) and sd["txt_in.weight"].shape == (2560, 5120)
    assert sd["blocks.0.mlp.vid.proj_in_gate.weight"].shape == (6912, 2560)
    assert {"vid_out_ada.out_shift", "vid_out_ada.out_scale", "vid_out_norm.weight"} <= set(sd)
    vsd = vae.state_dict()
    assert vsd["decoder.up_blocks.0.upsamplers.0.upscale_conv.weight"].shape == (4096, 512, 1, 1, 1)
    assert vsd["decoder.up_blocks.2.upsamplers.0.upscale_conv.weight"].shape == (1024, 256, 1, 1, 1)
    assert vsd["encoder.down_blocks.0.downsamplers.0.conv.weight"].shape == (128, 128, 1, 3, 3)
    assert vsd["encoder.down_blocks.1.downsamplers.0.conv.weight"].shape == (256, 256, 3, 3, 3)
    assert "encoder.mid_block.attentions.0.to_out.0.weight" in vsd


def test_checkpoint_round_trip_is_strict(tiny: M.SeedVR2, tmp_path) -> None:
    M.save(tiny, tmp_path / "ck")
    again = M.load(tmp_path / "ck")
    assert again.config == TINY
    for a, b in ((tiny.dit, again.dit), (tiny.vae, again.vae)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(tiny.text, again.text)
    vid = torch.randn(1, 8, 8, 33)
    with torch.inference_mode():  # same weights; BLAS may differ by buffer alignment (~1e-7)
        torch.testing.assert_close(tiny.dit(vid, tiny.text, 1000.0), again.dit(vid, again.text, 1000.0),
                                   rtol=0, atol=1e-5)

    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "ck" / "dit.safetensors"))
    state.pop("blocks.1.attn.rope.rope.freqs")            # the buffers a strict load needs
    save_file(state, str(tmp_path / "ck" / "dit.safetensors"))
    with pytest.raises(KeyError, match="rope.rope.freqs"):
        M.load(tmp_path / "ck")
    state["blocks.1.attn.rope.rope.freqs"] = torch.zeros(7)  # wrong shape (tiny has 5)
    save_file(state, str(tmp_path / "ck" / "dit.safetensors"))
    with pytest.raises(ValueError, match="shape"):
        M.load(tmp_path / "ck")
    state["blocks.1.attn.rope.rope.freqs"] = again.dit.blocks[1].attn.rope.rope.freqs.clone()
    state["blocks.3.mlp.txt.proj_in.weight"] = torch.zeros(192, 64)  # last block has no txt mlp
    save_file(state, str(tmp_path / "ck" / "dit.safetensors"))
    with pytest.raises(KeyError, match="unexpected"):
        M.load(tmp_path / "ck")


def test_config_json_round_trip() -> None:
    for cfg in (TINY, REAL):
        assert SeedVR2Config.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError):
        SeedVR2Config.from_json({"dit": {"bogus": 1}})


def test_output_head_uses_attention_slot_of_interleaved_emb(tiny: M.SeedVR2) -> None:
    """Independent formula: x*(emb[d*6+1]+out_scale) + (emb[d*6+0]+out_shift). The wrong public
    reading (first 3D elements of emb as shift/scale/gate) must give a clearly different output."""
    dit = tiny.dit
    D = dit.cfg.vid_dim
    emb = dit.emb_in(1000.0).detach()
    x = torch.randn(10, D)
    with torch.inference_mode():
        got = dit.output_head(x, emb)
        n = rms_norm(x, 1e-5, dit.vid_out_norm.weight)
        scale = emb[1::6] + dit.vid_out_ada.out_scale
        shift = emb[0::6] + dit.vid_out_ada.out_shift
        want = dit.vid_out.proj(n * scale + shift)
        wrong = dit.vid_out.proj(n * (emb[D:2 * D] + dit.vid_out_ada.out_scale)
                                 + emb[:D] + dit.vid_out_ada.out_shift)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert (wrong - want).norm() / want.norm() > 0.1


def test_block_modulation_reads_emb_interleaved(tiny: M.SeedVR2) -> None:
    """emb[d*6 + l*3 + g]: l=0 attention, 1 MLP; g = shift, scale, gate."""
    ada = tiny.dit.blocks[0].ada.get("vid")
    D = tiny.dit.cfg.vid_dim
    emb = torch.arange(6 * D, dtype=torch.float32)
    e3 = emb.reshape(D, 2, 3)
    x = torch.ones(1, D)
    with torch.no_grad():
        mlp_in = ada.modulate_in(x, e3, "mlp", 1)
        attn_out = ada.modulate_out(x, e3, "attn", 0)
    d = torch.arange(D, dtype=torch.float32)
    torch.testing.assert_close(mlp_in[0], (d * 6 + 4 + ada.mlp_scale) + (d * 6 + 3 + ada.mlp_shift))
    torch.testing.assert_close(attn_out[0], d * 6 + 2 + ada.attn_gate)


def _last_block_by_hand(dit: NaDiT, vid: torch.Tensor, txt: torch.Tensor, emb: torch.Tensor,
                        modulate_text: bool) -> torch.Tensor:
    """Spec section 1.6, written out for a single-window grid: the text stream enters attention
    normalised but UNmodulated (``modulate_text=True`` is the known wrong variant)."""
    blk = dit.blocks[-1]
    a, D, H, hd = blk.attn, dit.cfg.vid_dim, dit.cfg.heads, dit.cfg.head_dim
    e = emb.reshape(D, 6)
    ada = blk.ada.all
    vn = rms_norm(vid, 1e-5) * (e[:, 1] + ada.attn_scale) + (e[:, 0] + ada.attn_shift)
    tn = rms_norm(txt, 1e-5)
    if modulate_text:
        tn = tn * (e[:, 1] + ada.attn_scale) + (e[:, 0] + ada.attn_shift)
    L = txt.shape[0]
    t, h, w = 1, 4, 4
    pos_v = video_positions(np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij"),
                                     -1).reshape(-1, 3), L)
    cv, sv = a.rope.tables(torch.from_numpy(pos_v))
    ct, st = a.rope.tables(torch.from_numpy(text_positions(L)))

    def qkv(x, c, s):
        q, k, v = a.proj_qkv.all(x).reshape(-1, 3, H, hd).unbind(1)
        q, k = a.norm_q.all(q), a.norm_k.all(k)
        return apply_rope(q, c[:, None], s[:, None]), apply_rope(k, c[:, None], s[:, None]), v

    q1, k1, v1 = qkv(vn, cv, sv)
    q2, k2, v2 = qkv(tn, ct, st)
    q, k, v = (torch.cat(p).transpose(0, 1) for p in ((q1, q2), (k1, k2), (v1, v2)))
    att = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(hd), -1) @ v
    o = att.transpose(0, 1)[: vid.shape[0]].reshape(vid.shape[0], H * hd)
    vid = vid + a.proj_out.all(o) * (e[:, 2] + ada.attn_gate)
    m = rms_norm(vid, 1e-5) * (e[:, 4] + ada.mlp_scale) + (e[:, 3] + ada.mlp_shift)
    return vid + blk.mlp.all(m) * (e[:, 5] + ada.mlp_gate)


def test_last_block_text_is_unmodulated(tiny: M.SeedVR2) -> None:
    dit = tiny.dit
    g = torch.Generator().manual_seed(1)
    vid = torch.randn(16, dit.cfg.vid_dim, generator=g)
    txt = torch.randn(5, dit.cfg.txt_dim, generator=g)
    emb = dit.emb_in(1000.0).detach()
    blk = dit.blocks[-1]
    assert blk.is_last and blk.shifted  # 4x4 grid: one window even when shifted
    plan = dit.window_plan((1, 4, 4), blk.shifted, 5, blk.attn.rope)
    assert len(plan.index) == 1
    tc, ts = blk.attn.rope.tables(torch.from_numpy(text_positions(5)))
    with torch.inference_mode():
        got, txt_out = blk(vid, txt, emb, plan, tc, ts)
        want = _last_block_by_hand(dit, vid, txt, emb, modulate_text=False)
        wrong = _last_block_by_hand(dit, vid, txt, emb, modulate_text=True)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    assert (wrong - want).norm() / want.norm() > 1e-3
    assert torch.equal(txt_out, txt)


def test_mmrope_layout() -> None:
    """Adjacent pairs, axis groups t/h/w of 42 channels, last 2 channels unrotated (real dims)."""
    rope = MMRoPE3d(128, 42, 10000.0)
    assert rope.rope.freqs.shape == (21,)
    pos = torch.tensor([[3, 5, 7]])
    cos, sin = rope.tables(pos)
    f = rope.rope.freqs
    for axis, p in enumerate((3, 5, 7)):
        for k in (0, 20):
            ch = axis * 42 + 2 * k
            assert math.isclose(cos[0, ch].item(), math.cos(p * f[k].item()), abs_tol=1e-6)
            assert cos[0, ch + 1] == cos[0, ch] and sin[0, ch + 1] == sin[0, ch]
    assert torch.equal(cos[0, 126:], torch.ones(2)) and torch.equal(sin[0, 126:], torch.zeros(2))
    x = torch.zeros(1, 128)
    x[0, 42] = 1.0  # first h channel: rotates into channel 43
    y = apply_rope(x, cos, sin)
    assert math.isclose(y[0, 43].item(), math.sin(5 * f[0].item()), abs_tol=1e-6)
    assert y[0, 41].item() == 0.0
    x = torch.zeros(1, 128)
    x[0, 126], x[0, 127] = 2.0, 3.0
    assert torch.equal(apply_rope(x, cos, sin), x)
    assert video_positions(np.array([[0, 1, 2]]), 58).tolist() == [[58, 1, 2]]
    assert text_positions(3).tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]


def test_timestep_sinusoid_is_sin_then_cos() -> None:
    s = timestep_sinusoid(1000.0, 256)
    assert math.isclose(s[0].item(), math.sin(1000.0), abs_tol=1e-4)
    assert math.isclose(s[128].item(), math.cos(1000.0), abs_tol=1e-4)
    assert math.isclose(s[1].item(), math.sin(1000.0 * math.exp(-math.log(1e4) / 128)), abs_tol=1e-4)


def test_port_loads_checkpoint_folder_and_rejects_foreign_rope_freqs(tiny: M.SeedVR2, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from ncnnport.models.seedvr2.port import PORT
    from ncnnport.registry import get_port

    assert get_port("seedvr2") is PORT
    M.save(tiny, tmp_path / "ck")
    loaded = PORT.load("tiny", tmp_path / "ck")
    assert loaded.config == TINY.to_json() and loaded.ckpt == tmp_path / "ck"
    assert torch.equal(loaded.reference.dit.vid_out.proj.weight, tiny.dit.vid_out.proj.weight)
    state = load_file(str(tmp_path / "ck" / "dit.safetensors"))
    state["blocks.2.attn.rope.rope.freqs"] = state["blocks.2.attn.rope.rope.freqs"] * 2
    save_file(state, str(tmp_path / "ck" / "dit.safetensors"))
    with pytest.raises(ValueError, match="blocks.2.attn.rope.rope.freqs"):
        PORT.load("tiny", tmp_path / "ck")


def test_real_split_is_declared_without_weights() -> None:
    """The real 3B split (specs only; builds are lazy, weights stay on the meta device)."""
    from ncnnport.models.seedvr2.specs import module_specs

    with torch.device("meta"):
        dit, vae = NaDiT(REAL.dit), VideoAutoencoderKL(REAL.vae)
    specs = {s.name: s for s in module_specs(M.SeedVR2(REAL, dit, vae, torch.empty(58, 5120, device="meta")))}
    assert len(specs) == 5 + 5 + 3 + 2 * 32 + 1  # VAE graphs, their image twins, DiT
    assert specs["vae_decode_3_image"].inputs[0].shape == (1, 256, 1, "h", "w")
    pre, post = specs["dit_block_31_pre"], specs["dit_block_31_post"]
    assert [t.shape for t in pre.inputs[:3]] == [(1, "n", 2560), (1, "l", 2560), (1, 6, 2560)]
    assert pre.outputs[0].shape == (1, "n", 20, 128) and pre.inputs[3].shape == (1, "n", 128)
    assert [t.name for t in post.inputs] == ["vid", "emb6", "attn_v"]
    assert [t.name for t in specs["dit_block_30_post"].outputs] == ["vid_out", "txt_out"]
    assert specs["dit_input"].inputs[0].shape == (1, "n", 132)
    assert specs["dit_output"].outputs[0].shape == (1, "n", 64)
    assert specs["vae_decode_0"].outputs[0].shape[1] == 4096 and specs["vae_decode_2"].outputs[0].shape[1] == 1024
    assert specs["vae_decode_3"].inputs[0].shape[1] == 256 and specs["vae_decode_3"].outputs[0].shape[1] == 3
