"""The official qwen-asr checkpoint layout (thinker_config, thinker.* names, explicit head) loads
strictly through the declared rename tables, folders written in it load in the official package,
and configs are strict: every field the model uses must be in config.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ncnnport.models.qwen3_asr.checkpoint import (CheckpointError, load_checkpoint, load_config,
                                                  load_processor, write_official_folder)
from ncnnport.models.qwen3_asr.port import PORT


@pytest.fixture(scope="module")
def official_folder(tiny_loaded, tmp_path_factory) -> Path:
    model, processor = tiny_loaded
    return write_official_folder(model, processor, tmp_path_factory.mktemp("official") / "ckpt")


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(folder, dst)
    return dst


# --- item 11: the official checkpoint layout ------------------------------------------------------
def test_official_layout_is_what_the_official_package_names(official_folder) -> None:
    config = json.loads((official_folder / "config.json").read_text())
    assert "thinker_config" in config and "text_config" not in config
    names = set(load_file(str(official_folder / "model.safetensors")))
    assert "thinker.lm_head.weight" in names
    assert all(n.startswith("thinker.") for n in names)
    assert "thinker.audio_tower.proj1.weight" in names and "thinker.model.embed_tokens.weight" in names


def test_official_layout_loads_with_exactly_the_same_weights(official_folder, tiny_loaded) -> None:
    model, _ = tiny_loaded
    loaded, processor = load_checkpoint(official_folder)
    ours = loaded.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(ours[name], tensor), name
    assert loaded.config.text_config.rope_parameters["rope_theta"] == 1e6
    assert loaded.config.audio_token_id == model.config.audio_token_id
    assert processor.tokenizer.audio_token == "<|audio_pad|>"


def test_official_layout_lazy_parts_equal_the_full_model(official_folder, tiny_loaded) -> None:
    model, _ = tiny_loaded
    loaded = PORT.load("tiny", official_folder)
    lazy = loaded.reference
    assert torch.equal(lazy.source.get("model.multi_modal_projector.linear_2.weight"),
                       model.model.multi_modal_projector.linear_2.weight)
    assert torch.equal(lazy.source.get("lm_head.weight"), model.lm_head.weight)


def test_official_layout_unexpected_tensor_is_named(official_folder, tmp_path) -> None:
    folder = _copy(official_folder, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state["thinker.audio_tower.extra.weight"] = torch.zeros(2)
    state["talker.thing"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"talker\.thing"):
        load_checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"model\.audio_tower\.extra\.weight"):
        del state["talker.thing"]
        save_file(state, str(folder / "model.safetensors"))
        load_checkpoint(folder)


def test_official_layout_missing_and_misshaped_tensors_are_named(official_folder, tmp_path) -> None:
    folder = _copy(official_folder, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    del state["thinker.model.norm.weight"]
    state["thinker.audio_tower.ln_post.weight"] = torch.zeros(3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    assert "model.language_model.norm.weight" in str(err.value)
    assert "model.audio_tower.ln_post.weight" in str(err.value)


def test_tied_config_with_a_different_explicit_head_is_refused(official_folder, tmp_path) -> None:
    folder = _copy(official_folder, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state["thinker.lm_head.weight"] = state["thinker.lm_head.weight"] + 1.0
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        load_checkpoint(folder)


def test_preset_tokenizer_config_has_extra_special_tokens_as_a_dict(tiny_folder) -> None:
    cfg = json.loads((tiny_folder / "tokenizer_config.json").read_text())
    assert cfg["extra_special_tokens"] == {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                                           "audio_eos_token": "<|audio_end|>"}
    assert load_processor(tiny_folder).tokenizer.audio_token == "<|audio_pad|>"


# --- item 9: strict configs -----------------------------------------------------------------------
def _drop(raw: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for p in parents:
        node = node[p]
    del node[leaf]


@pytest.mark.parametrize("field", ["text_config.rope_parameters", "text_config.rms_norm_eps",
                                   "text_config.max_position_embeddings", "audio_token_id",
                                   "audio_config.n_window_infer", "eos_token_id"])
def test_missing_config_field_is_an_error_naming_field_and_file(tiny_folder, tmp_path, field) -> None:
    folder = _copy(tiny_folder, tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    _drop(raw, field)
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError) as err:
        load_config(folder)
    assert field.split(".")[-1] in str(err.value) or "rope_theta" in str(err.value)
    assert str(folder / "config.json") in str(err.value)


def test_missing_rope_theta_in_official_config_names_the_official_field(official_folder, tmp_path) -> None:
    folder = _copy(official_folder, tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    del raw["thinker_config"]["text_config"]["rope_theta"]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"thinker_config\.text_config\.rope_theta"):
        load_config(folder)


@pytest.mark.parametrize("name", ["tiny", "real"])
def test_presets_are_complete(name, tmp_path) -> None:
    from ncnnport.models.qwen3_asr.presets import preset_folder

    config = load_config(preset_folder(name, cache_dir=tmp_path))
    assert config.text_config.rope_parameters["rope_theta"] == 1e6


