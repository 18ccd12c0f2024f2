"""PyTorch reference: vision RoPE, window attention, merger, prompt, fusion, greedy variety."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.models.youtu_vl.config import IMAGE_PAD_ID, SPECIAL_TOKENS, tiny_config
from ncnnport.models.youtu_vl.fixtures import synthetic_image
from ncnnport.models.youtu_vl.model import reference_generate
from ncnnport.models.youtu_vl.processor import patch_positions, process_image
from ncnnport.models.youtu_vl.prompt import chat_text, encode_prompt, fuse
from ncnnport.runtime.rope2d import axial_cos_sin, axial_inv_freq


def test_axial_rope_matches_transformers_qwen25_vision_rotary():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionRotaryEmbedding

    for hidden, heads in [(64, 4), (1152, 16)]:
        cfg = Qwen2_5_VLVisionConfig(hidden_size=hidden, num_heads=heads,
                                     rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
        rot = Qwen2_5_VLVisionRotaryEmbedding(cfg)
        pos = patch_positions(12, 18, 2)
        cos_ref, sin_ref = rot(torch.zeros(1), torch.from_numpy(pos))
        cos, sin = axial_cos_sin(pos, axial_inv_freq(hidden // heads, 10000.0))
        # same layout and frequencies; numpy's and torch's float32 pow/cos may differ by an ulp of
        # the angle (angles reach 17 rad here: ulp 1.9e-6), far below any parity gate. A layout or
        # frequency error would be off by O(0.1).
        np.testing.assert_allclose(cos, cos_ref.numpy(), atol=4e-6, rtol=0)
        np.testing.assert_allclose(sin, sin_ref.numpy(), atol=4e-6, rtol=0)


def test_reference_rope_angles_match_runtime_tables(tiny):
    vl, _ = tiny
    tower = vl.siglip2.vision_model
    angles = tower.rotary_angles((12, 18))
    emb = torch.cat((angles, angles), -1)
    cos, sin = axial_cos_sin(patch_positions(12, 18, 2), axial_inv_freq(tower.cfg.head_dim, 1e4))
    np.testing.assert_allclose(emb.cos().numpy(), cos, atol=1e-7)
    np.testing.assert_allclose(emb.sin().numpy(), sin, atol=1e-7)


def _masked_tower(vl, pv: np.ndarray, grid) -> np.ndarray:
    """Independent formulation: no permutation at all, attention restricted by window membership.

    Window attention only depends on which tokens share a window, so masking in raster order must
    equal the official permute -> split attention -> argsort path, if the reference is right.
    """
    from ncnnport.models.youtu_vl.processor import window_layout

    tower = vl.siglip2.vision_model
    cfg = tower.cfg
    n = pv.shape[0]
    index, cu = window_layout(*grid, 2, cfg.window_tokens)
    window_of_token = np.empty(n // 4, dtype=np.int64)
    for w, (a, b) in enumerate(zip(cu[:-1] // 4, cu[1:] // 4)):
        window_of_token[index[a:b]] = w
    win = np.repeat(window_of_token, 4)
    mask = torch.from_numpy(np.where(win[:, None] == win[None, :], 0.0, -np.inf).astype(np.float32))
    angles = tower.rotary_angles(grid)
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]
    rot = lambda t: torch.cat((-t[..., t.shape[-1] // 2:], t[..., :t.shape[-1] // 2]), -1)  # noqa: E731
    with torch.no_grad():
        h = tower.embeddings(torch.from_numpy(pv))
        for i, blk in enumerate(tower.encoder.layers):
            a = blk.self_attn
            x = blk.layer_norm1(h)
            q, k, v = (p(x).view(n, a.num_heads, a.head_dim) for p in (a.q_proj, a.k_proj, a.v_proj))
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            m = torch.zeros(n, n) if i in cfg.fullatt_block_indexes else mask
            att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * a.scale + m, -1)
            h = h + a.out_proj(torch.einsum("hqk,khd->qhd", att, v).reshape(n, -1))
            h = h + blk.mlp(blk.layer_norm2(h))
        return tower.post_layernorm(h).numpy()


@pytest.mark.parametrize("size_hw", [(180, 270), (520, 300), (32, 2048), (200, 230)])
def test_vision_reference_equals_masked_raster_formulation(tiny, size_hw):
    vl, _ = tiny
    img = process_image(synthetic_image(*size_hw), vl.cfg.vision, vl.cfg.processor)
    ref = vl.vision_features(img)
    alt = _masked_tower(vl, img.pixel_values, img.grid_hw)
    assert ref.shape == (img.num_patches, vl.cfg.vision.hidden_size)
    np.testing.assert_allclose(ref, alt, atol=2e-5, rtol=0)


def test_skipping_the_inverse_permutation_changes_the_output(tiny):
    """Guard for the classic bug: on a 2-window grid window order != raster order."""
    vl, _ = tiny
    img = process_image(synthetic_image(180, 270), vl.cfg.vision, vl.cfg.processor)
    ref = vl.vision_features(img)
    from ncnnport.models.youtu_vl.processor import patch_permutation, window_layout

    perm = patch_permutation(window_layout(12, 18, 2, 8)[0], 4)
    assert np.abs(ref[perm] - ref).max() > 0.1


def test_merger_equals_transformers_qwen25_patch_merger(tiny):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLPatchMerger

    vl, _ = tiny
    cfg = vl.cfg.vision
    other = Qwen2_5_VLPatchMerger(dim=cfg.out_hidden_size, context_dim=cfg.hidden_size)
    other.load_state_dict(vl.merger.state_dict(), strict=True)
    x = torch.randn(216, cfg.hidden_size)
    with torch.no_grad():
        np.testing.assert_allclose(vl.merger(x).numpy(), other(x).numpy(), atol=1e-6)
    assert vl.merge(x.numpy()).shape == (54, cfg.out_hidden_size)


def test_chat_prompt_text_and_ids(tiny):
    vl, tok = tiny
    text = chat_text("Hi", 3, "Sys")
    assert text == ("<|begin_of_text|>system\nSys<|end_of_text|>\n<|begin_of_text|>user\n"
                    "<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>Hi"
                    "<|end_of_text|>\n<|begin_of_text|>assistant\n")
    ids = encode_prompt(tok, "Hi", 3, "Sys")
    assert ids[0] == SPECIAL_TOKENS["<|begin_of_text|>"]
    assert (ids == IMAGE_PAD_ID).sum() == 3
    pad_at = np.flatnonzero(ids == IMAGE_PAD_ID)
    assert ids[pad_at[0] - 1] == SPECIAL_TOKENS["<|vision_start|>"]
    assert ids[pad_at[-1] + 1] == SPECIAL_TOKENS["<|vision_end|>"]
    assert tok.decode(ids.tolist(), skip_special_tokens=False) == text
    assert (encode_prompt(tok, "Hi", None, "Sys") == IMAGE_PAD_ID).sum() == 0


def test_fuse_replaces_pad_rows_in_order():
    ids = np.array([1, IMAGE_PAD_ID, 2, IMAGE_PAD_ID, IMAGE_PAD_ID])
    emb = np.zeros((5, 4), np.float32)
    vis = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = fuse(emb, ids, vis)
    np.testing.assert_array_equal(out[[1, 3, 4]], vis)
    np.testing.assert_array_equal(out[[0, 2]], 0)
    with pytest.raises(ValueError):
        fuse(emb, ids, vis[:2])


def test_greedy_tokens_vary_and_logits_match_a_full_forward(tiny):
    vl, tok = tiny
    img = process_image(synthetic_image(180, 270), vl.cfg.vision, vl.cfg.processor)
    ids = encode_prompt(tok, "What is in the picture?", img.num_tokens, vl.cfg.system_prompt)
    run = reference_generate(vl, ids, img, 32, stop_at_eos=False)
    assert run.merged.shape == (54, vl.cfg.text.hidden_size)
    assert len(run.tokens) == 32
    assert len(set(run.tokens)) >= 8, run.tokens
    # the cached decode must equal a cache-free forward over prompt + generated tokens
    from ncnnport.models.youtu_vl.prompt import fuse as fuse_rows

    full_ids = np.concatenate([ids, np.array(run.tokens[:-1])])
    emb = fuse_rows(vl.embed(full_ids), full_ids, run.merged)
    with torch.no_grad():
        logits = vl.llm(inputs_embeds=torch.from_numpy(emb)[None]).logits[0].numpy()
    np.testing.assert_allclose(logits[-1], run.step_logits[-1], atol=1e-4)
    assert np.argmax(logits[len(ids) - 1:], -1).tolist() == run.tokens


def test_tiny_config_keeps_real_proportions():
    cfg = tiny_config()
    assert cfg.vision.head_dim % 4 == 0
    assert cfg.vision.window_tokens == 8
    assert cfg.vision.num_hidden_layers - 1 in cfg.vision.fullatt_block_indexes
    assert cfg.text.rope_interleave and cfg.text.vocab_size >= 128266
    assert cfg.text.q_lora_rank / cfg.text.hidden_size == 1536 / 2560
    assert cfg.text.kv_lora_rank / cfg.text.hidden_size == 512 / 2560


def test_mid_and_real_configs_use_real_widths():
    from ncnnport.models.youtu_vl.config import preset_config

    real, mid = preset_config("real"), preset_config("mid")
    assert (real.vision.head_dim, real.vision.window_tokens, real.vision.fullatt_block_indexes) == (72, 8,
                                                                                                  (7, 15, 23, 26))
    assert real.text.qk_head_dim == 192 and real.text.vocab_size == 283386
    assert mid.vision.head_dim == 72 and mid.text.hidden_size == 2560 and mid.text.kv_lora_rank == 512
    assert mid.vision.num_hidden_layers - 1 in mid.vision.fullatt_block_indexes


def test_torch_device_bench_runs_the_cpu_bench_work(tiny):
    """``bench --torch-device``'s path (tower + merger copied to the device) computes what the CPU
    bench call computes; run here on the CPU."""
    from ncnnport.models.youtu_vl.bench import _device_encode_call, bench_image, torch_call

    vl = tiny[0]
    ref = torch_call(vl, "vision_encoder", "64x64")()
    got = _device_encode_call(vl, bench_image(vl, "64x64"), "cpu")()
    assert [a.shape for a in got] == [a.shape for a in ref]
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ref, got))
    step = torch_call(vl, "layers", "4", device="cpu")
    assert np.array_equal(step()[0], step()[0])
