"""Checkpoint folders: save then strict load, and clear errors for tampered folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ncnnport.models.qwen3_asr.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ncnnport.models.qwen3_asr.presets import load
from ncnnport.models.qwen3_asr.presets import build_tiny_model, build_tiny_processor


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    model = build_tiny_model()
    folder = save_checkpoint(model, build_tiny_processor(), tmp_path_factory.mktemp("ckpt") / "tiny")
    return folder, model


def clone(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(folder, dst)
    return dst


def test_folder_looks_like_a_checkpoint(saved) -> None:
    folder, _ = saved
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen3_asr"
    assert "lm_head.weight" not in load_file(str(folder / "model.safetensors"))  # tied, like HF


def test_round_trip_is_exact(saved) -> None:
    folder, model = saved
    loaded, processor = load_checkpoint(folder)
    ref = model.state_dict()
    got = loaded.state_dict()
    assert ref.keys() == got.keys()
    for key in ref:
        assert torch.equal(ref[key], got[key]), key
    assert loaded.lm_head.weight.data_ptr() == loaded.model.language_model.embed_tokens.weight.data_ptr()
    assert processor.audio_token_id == loaded.config.audio_token_id
    assert processor.tokenizer.convert_ids_to_tokens(loaded.config.audio_token_id) == "<|audio_pad|>"
    x = torch.randn(1, 128, 100)
    mask = torch.ones(1, 100, dtype=torch.long)
    with torch.no_grad():
        a = model.get_audio_features(x, mask).pooler_output
        b = loaded.get_audio_features(x, mask).pooler_output
    assert torch.equal(a, b)


def test_missing_key_is_named(saved, tmp_path: Path) -> None:
    folder = clone(saved[0], tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    del state["model.language_model.layers.1.self_attn.k_norm.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*layers\.1\.self_attn\.k_norm\.weight"):
        load_checkpoint(folder)


def test_unexpected_key_is_named(saved, tmp_path: Path) -> None:
    folder = clone(saved[0], tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state["model.extra_head.weight"] = torch.zeros(3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected 1 tensor.*extra_head"):
        load_checkpoint(folder)


def test_shape_mismatch_is_named(saved, tmp_path: Path) -> None:
    folder = clone(saved[0], tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state["model.multi_modal_projector.linear_2.bias"] = torch.zeros(7)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"shape mismatch.*linear_2\.bias"):
        load_checkpoint(folder)


def test_pickle_weights_refused(saved, tmp_path: Path) -> None:
    folder = clone(saved[0], tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle weights are refused"):
        load_checkpoint(folder)


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_load_preset_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NCNNPORT_CACHE", str(tmp_path))
    model, processor = load("preset:tiny")
    assert model.config.text_config.num_key_value_heads < model.config.text_config.num_attention_heads
    ref = build_tiny_model().state_dict()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in ref.items())
    with pytest.raises(CheckpointError, match="no weights"):
        load("real")


def test_incomplete_original_layout_config_names_its_fields(saved, tmp_path: Path) -> None:
    # the official layout loads (test_qwen3_asr_fidelity.py); an empty thinker_config is an
    # error naming the official fields it lacks
    folder = clone(saved[0], tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_asr", "thinker_config": {}}))
    with pytest.raises(CheckpointError, match=r"thinker_config\.text_config\.rope_theta"):
        load_checkpoint(folder)
