"""Checkpoint folder round trip and strictness; tokenizer special ids."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ncnnport.models.youtu_vl.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ncnnport.models.youtu_vl.config import SPECIAL_TOKENS, YoutuVLConfig, tiny_config
from ncnnport.models.youtu_vl.presets import build_preset_model


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_round_trip_is_bit_exact(tiny, tiny_folder, tmp_path):
    vl, _ = tiny
    save_checkpoint(vl, tmp_path / "ck")
    shutil.copy(tiny_folder / "tokenizer.json", tmp_path / "ck" / "tokenizer.json")
    again, tok = load_checkpoint(tmp_path / "ck")
    a, b = vl.state_dict(), again.state_dict()
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    names = load_file(str(tmp_path / "ck" / "model.safetensors"))
    assert "lm_head.weight" not in names
    assert any(k.startswith("siglip2.vision_model.encoder.layers.0.self_attn.q_proj") for k in names)
    assert "merger.mlp.0.weight" in names and "model.embed_tokens.weight" in names
    assert YoutuVLConfig.from_json(json.loads((tmp_path / "ck" / "config.json").read_text())) == vl.cfg


def test_missing_tokenizer_is_an_error(tiny, tmp_path):
    vl, _ = tiny
    save_checkpoint(vl, tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_checkpoint(tmp_path / "ck")


def test_preset_is_deterministic():
    a = build_preset_model(tiny_config(), seed=3).state_dict()
    b = build_preset_model(tiny_config(), seed=3).state_dict()
    c = build_preset_model(tiny_config(), seed=4).state_dict()
    key = "model.layers.0.self_attn.q_b_proj.weight"
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])


def _edit_weights(folder, fn):
    path = folder / "model.safetensors"
    state = load_file(str(path))
    fn(state)
    save_file(state, str(path))


def test_missing_key_is_an_error(tiny_folder, tmp_path):
    ck = _copy(tiny_folder, tmp_path / "ck")
    _edit_weights(ck, lambda s: s.pop("merger.mlp.2.bias"))
    with pytest.raises(CheckpointError, match="missing keys.*merger.mlp.2.bias"):
        load_checkpoint(ck)


def test_unexpected_key_is_an_error(tiny_folder, tmp_path):
    ck = _copy(tiny_folder, tmp_path / "ck")
    _edit_weights(ck, lambda s: s.__setitem__("siglip2.vision_model.head.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match="unexpected keys.*head.weight"):
        load_checkpoint(ck)


def test_wrong_shape_is_an_error(tiny_folder, tmp_path):
    ck = _copy(tiny_folder, tmp_path / "ck")
    _edit_weights(ck, lambda s: s.__setitem__("merger.ln_q.weight", torch.ones(3)))
    with pytest.raises(CheckpointError, match="merger.ln_q.weight has shape"):
        load_checkpoint(ck)


def test_unused_position_embedding_is_tolerated(tiny_folder, tmp_path):
    ck = _copy(tiny_folder, tmp_path / "ck")
    _edit_weights(ck, lambda s: s.__setitem__(
        "siglip2.vision_model.embeddings.position_embedding.weight", torch.zeros(16, 64)))
    vl, _ = load_checkpoint(ck)
    assert not any("position_embedding" in k for k in vl.state_dict())


def test_tokenizer_special_ids_and_byte_round_trip(tiny):
    _, tok = tiny
    for token, idx in SPECIAL_TOKENS.items():
        assert tok.token_to_id(token) == idx
    text = "Two tabby cats 这是什么 ✓"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_loaded_model_runs_like_the_saved_one(tiny, tiny_folder):
    vl, _ = tiny
    again, _ = load_checkpoint(tiny_folder)
    ids = torch.tensor([[128000, 5, 9, 300, 128001]])
    with torch.no_grad():
        np.testing.assert_array_equal(vl.llm(input_ids=ids).logits.numpy(),
                                      again.llm(input_ids=ids).logits.numpy())


def test_sharded_checkpoint_with_index_loads(tiny, tiny_folder, tmp_path):
    vl, _ = tiny
    ck = _copy(tiny_folder, tmp_path / "ck")
    state = load_file(str(ck / "model.safetensors"))
    (ck / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(ck / name))
        weight_map.update({k: name for k in ks})
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    again, _ = load_checkpoint(ck)
    for k, v in vl.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    (ck / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="shards listed in .* are missing: .*model-00002-of-00002"):
        load_checkpoint(ck)
