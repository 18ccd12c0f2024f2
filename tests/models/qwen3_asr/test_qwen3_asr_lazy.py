"""Qwen3-ASR built one module at a time: seeded per-tensor weights, checkpoint reads per module,
LAYERS=K truncation (small configs only; the real one is measured by `ncnnport convert`)."""

from __future__ import annotations

import copy

import pytest
import torch

from ncnnport.models.qwen3_asr import lazy
from ncnnport.models.qwen3_asr.port import PORT
from ncnnport.models.qwen3_asr.presets import tiny_config
from ncnnport.models.qwen3_asr.specs import module_specs, module_weight_bytes
from ncnnport.targets import Target


def small_config(layers: int = 4):
    cfg = copy.deepcopy(tiny_config())
    cfg.text_config.num_hidden_layers = layers
    cfg.text_config.layer_types = ["full_attention"] * layers
    cfg.audio_config.encoder_layers = layers
    return cfg


def _spec(specs, name):
    return next(s for s in specs if s.name == name)


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_seeded_layer_built_alone_equals_the_same_layer_of_a_full_build():
    alone = lazy.seeded(small_config(), seed=0)
    layer3 = _spec(module_specs(alone), "decode_layer3").build()
    reads = set(alone.source.reads)
    assert reads and all(n.startswith("model.language_model.layers.3.") for n in reads)
    full = lazy.seeded(small_config(), seed=0).full()
    ref = full.model.language_model.layers[3].state_dict()
    got = layer3.layers[0].state_dict()
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    again = _spec(module_specs(alone), "decode_layer3").build()      # same tensor twice: identical
    assert all(torch.equal(v, again.layers[0].state_dict()[k]) for k, v in got.items())
    other = lazy.seeded(small_config(), seed=1).part("model.language_model.layers.3")
    assert not torch.equal(other.self_attn.q_proj.weight, got["self_attn.q_proj.weight"])
    # the recipe: q/k norm gain ~3, other norms 1, tied head = embedding
    assert 2.0 < float(got["self_attn.q_norm.weight"].mean()) < 4.0
    assert torch.equal(got["input_layernorm.weight"], torch.ones_like(got["input_layernorm.weight"]))
    assert full.lm_head.weight.data_ptr() == full.model.language_model.embed_tokens.weight.data_ptr()
    # torch wrapper over the part-built layer computes what the full model's layer computes
    spec = _spec(module_specs(alone), "decode_layer3")
    x = [torch.from_numpy(a) for a in spec.example_inputs(spec.trace_sizes(0))]
    from ncnnport.models.qwen3_asr.wrappers import TextDecodeLayer
    with torch.no_grad():
        a = layer3(*x)
        b = TextDecodeLayer(full.model.language_model.layers[3], full.config.text_config).eval()(*x)
    assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_layers_k_keeps_the_first_k_layers_with_the_same_weights():
    cfg = small_config(4)
    two = lazy.seeded(PORT.truncate(cfg, 2), seed=0)
    names = [s.name for s in module_specs(two)]
    assert [n for n in names if "layer" in n] == ["audio_layer0", "audio_layer1", "prefill_layer0", "prefill_layer1",
                                                  "decode_layer0", "decode_layer1"]
    four = lazy.seeded(cfg, seed=0)
    for path in ("model.language_model.layers.1", "model.audio_tower.layers.1", "lm_head"):
        assert all(torch.equal(a, b) for a, b in zip(two.part(path).state_dict().values(),
                                                      four.part(path).state_dict().values()))
    assert cfg.text_config.num_hidden_layers == 4                    # the input config is untouched
    with pytest.raises(ValueError, match="layers"):
        PORT.truncate(cfg, 5)
    sizes = module_weight_bytes(two)
    assert sizes["decode_layer1"] == sum(4 * p.numel() for p in two.part("model.language_model.layers.1").parameters())
    assert Target("qwen3-asr", "real", layers=4).tag == "real-L4"
    assert "layers:4" in Target("qwen3-asr", "real", layers=4).source


def test_checkpoint_folder_is_read_per_module_and_truncates(tiny_folder, tiny_loaded):
    from ncnnport.models.qwen3_asr.checkpoint import load_config
    from ncnnport.models.qwen3_asr.port import PORT

    model, _ = tiny_loaded
    folder_model = lazy.from_folder(tiny_folder, load_config(tiny_folder), truncated=False)
    layer = folder_model.part("model.language_model.layers.1")
    assert set(folder_model.source.reads) == {f"model.language_model.layers.1.{k}" for k in layer.state_dict()}
    ref = model.model.language_model.layers[1].state_dict()
    assert all(torch.equal(v, ref[k]) for k, v in layer.state_dict().items())
    head = folder_model.part("lm_head")                                # tied: read from the embedding
    assert torch.equal(head.weight, model.model.language_model.embed_tokens.weight)
    assert not folder_model.is_materialized
    loaded = PORT.load("tiny", tiny_folder, layers=1)
    assert loaded.reference.config.text_config.num_hidden_layers == 1
    names = [s.name for s in PORT.module_specs(loaded)]
    assert "decode_layer0" in names and "decode_layer1" not in names and "audio_layer1" not in names
