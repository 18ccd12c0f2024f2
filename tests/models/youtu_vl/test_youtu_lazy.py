"""Youtu-VL built one module at a time: seeded real-preset weights, lazy checkpoint reads, --layers,
and the streamed full-depth parity (one module of each side resident)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ncnnport.models.youtu_vl.port import PORT


def _tiny_cfg():
    from ncnnport.models.youtu_vl.config import tiny_config
    return tiny_config()


def test_seeded_part_equals_the_same_tensor_in_the_whole_model():
    from ncnnport.models.youtu_vl import lazy

    a = lazy.seeded(_tiny_cfg(), seed=3)
    layer = a.part("model.layers.1")
    assert set(a.source.reads) == {f"model.layers.1.{n}" for n, _ in layer.named_parameters()}
    whole = lazy.seeded(_tiny_cfg(), seed=3).full()
    for name, p in layer.named_parameters():
        assert torch.equal(p, whole.get_submodule("model.layers.1").get_parameter(name)), name
    other = lazy.seeded(_tiny_cfg(), seed=4).part("model.layers.1")
    assert not torch.equal(layer.mlp.gate_proj.weight, other.mlp.gate_proj.weight)
    # the tied head is the embedding table, read under its stored name
    assert torch.equal(whole.lm_head.weight, whole.model.embed_tokens.weight)
    head = lazy.seeded(_tiny_cfg(), seed=3)
    head.part("lm_head")
    assert set(head.source.reads) == {"model.embed_tokens.weight"}


def test_real_preset_builds_a_layer_without_the_rest():
    """The real 4B config: the skeleton has no storage, one decoder layer reads only its tensors."""
    from ncnnport.models.youtu_vl import lazy
    from ncnnport.models.youtu_vl.config import preset_config
    from ncnnport.models.youtu_vl.specs import module_weight_bytes

    vl = lazy.seeded(PORT.truncate(preset_config("real"), 2))
    sizes = module_weight_bytes(vl)
    assert sizes["llm_layer0"] == 4 * 104_242_176            # one real MLA layer, 398 MiB
    heads = [n for n in sizes if n.startswith("lm_head_part")]
    assert len(heads) == 7                  # 2.77 GB table in <= 512 MiB shards + the 10 leftover rows
    assert sum(sizes[n] for n in heads) == 4 * (283386 * 2560 + 7 * 2560)   # rows + a norm each
    assert max(sizes[n] for n in heads) <= 512 << 20
    layer = vl.part("model.layers.1")
    assert sum(p.numel() for p in layer.parameters()) == 104_242_176
    assert all(n.startswith("model.layers.1.") for n in vl.source.reads)
    assert not vl.is_materialized
    rms = float(layer.mlp.down_proj.weight.std())
    assert abs(rms - 9728 ** -0.5) < 0.01 * 9728 ** -0.5      # N(0, 1/fan_in)


def test_truncated_config_keeps_the_vision_tower_and_refuses_bad_counts():
    from ncnnport.models.youtu_vl import lazy

    cfg = _tiny_cfg()
    cut = PORT.truncate(cfg, 1)
    assert cut.text.num_hidden_layers == 1 and cut.vision == cfg.vision
    assert PORT.truncate(cfg, None) is cfg
    for bad in (0, cfg.text.num_hidden_layers + 1):
        with pytest.raises(ValueError, match="--layers"):
            PORT.truncate(cfg, bad)


def test_checkpoint_folder_is_read_per_module(tiny_folder, tiny):
    """Truncated: later layers are never read; whole: the strict loader's model."""
    from ncnnport.models.youtu_vl import lazy
    from ncnnport.models.youtu_vl.checkpoint import read_config

    vl_ref, _ = tiny
    cut = lazy.from_folder(tiny_folder, PORT.truncate(read_config(tiny_folder), 1), truncated=True)
    part = cut.part("model.layers.0")
    for name, p in part.named_parameters():
        assert torch.equal(p, vl_ref.model.layers[0].get_parameter(name)), name
    assert all(n.startswith("model.layers.0.") for n in cut.source.reads)
    whole = lazy.from_folder(tiny_folder, read_config(tiny_folder), truncated=False)
    assert torch.equal(whole.lm_head.weight, vl_ref.lm_head.weight)       # delegates to full()
    assert whole.part("model.norm") is whole.full().model.norm            # shares once built


def test_checkpoint_with_foreign_or_missing_tensors_is_refused(tiny_folder, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from ncnnport.models.youtu_vl import lazy
    from ncnnport.models.youtu_vl.checkpoint import CheckpointError, read_config

    state = load_file(str(tiny_folder / "model.safetensors"))
    cfg = read_config(tiny_folder)
    extra = tmp_path / "extra"
    shutil.copytree(tiny_folder, extra)
    save_file({**state, "model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}, str(extra / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected"):
        lazy.from_folder(extra, cfg, truncated=False)
    lazy.from_folder(extra, PORT.truncate(cfg, 1), truncated=True)  # later layers: expected
    missing = tmp_path / "missing"
    shutil.copytree(tiny_folder, missing)
    state.pop("model.layers.0.mlp.up_proj.weight")
    save_file(state, str(missing / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.up_proj.weight"):
        lazy.from_folder(missing, cfg, truncated=True)


def test_real_preset_folder_holds_no_weights(tmp_path):
    from ncnnport.models.youtu_vl.presets import materialise_preset

    folder = materialise_preset("real", root=tmp_path)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 40
    assert (folder / "tokenizer.json").is_file()
    assert not list(folder.glob("*.safetensors"))


@pytest.mark.slow
def test_streamed_parity_passes_and_names_a_perturbed_layer(built, tmp_path):
    """One module of each side resident at a time; a 1e-3 scaled layer fails at that layer's local
    row while every earlier layer still passes."""
    from ncnnport.models.youtu_vl.fixtures import FIXTURES
    from ncnnport.models.youtu_vl.streamed import streamed_parity
    from tests.perturb import perturbed_package

    prep, pkg = built
    vl, tok = prep.loaded.reference, prep.loaded.extra["tokenizer"]
    fx = next(f for f in FIXTURES if f.name == "grid_12x18")
    tol = lambda _name: prep.policy.default()  # noqa: E731
    recs, receipt = streamed_parity(vl, pkg, tok, fx, tol, tol)
    bad = [r for r in recs if not r["passed"]]
    assert not bad, bad
    stages = [r["stage"] for r in recs]
    assert "llm_layer2/propagated" in stages and stages[-1] == "next_token_argmax"
    assert recs[-1]["tokens_compared"] == 16
    assert receipt["ncnn_peak_live"] == 1          # never two graphs open together
    assert set(receipt["phases"]) >= {"vision_torch", "llm_layer0", "head_ncnn"}

    broken = perturbed_package(pkg, tmp_path / "pkg", ["llm_layer1"], factor=1.001)
    recs, _ = streamed_parity(vl, broken, tok, fx, tol, tol)
    by_stage = {r["stage"]: r for r in recs}
    assert by_stage["llm_layer0/local"]["passed"] and by_stage["llm_layer0/propagated"]["passed"]
    assert not by_stage["llm_layer1/local"]["passed"]
    assert not by_stage["llm_layer2/propagated"]["passed"]
    assert by_stage["llm_layer2/local"]["passed"]        # local rows isolate the broken graph


@pytest.mark.slow
def test_split_head_gives_the_same_logits_and_embedding_rows(tmp_path, monkeypatch):
    """A head table over the shard limit becomes vocab-row shards: the pipeline's logits and the
    tied embedding rows read from the shard .bin files equal the unsplit reference."""
    from ncnnport.models.youtu_vl import pipeline
    from ncnnport.models.youtu_vl.pipeline import LatentCache, forward_llm, head_shards
    from ncnnport.models.youtu_vl.tied_embed import EMBED_NAME, with_tied_embedding
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.runtime.lazy_modules import open_ncnn_modules
    from ncnnport.targets import Target

    monkeypatch.setattr(pipeline, "HEAD_SHARD_BYTES", 12 << 20)   # tiny table: 41 MB -> 4 shards + 10 rows
    prep = prepare(Target("youtu-vl", "tiny", None, tmp_path))
    vl = prep.loaded.reference
    shards = head_shards(vl.cfg)
    assert [s.name for s in shards] == [f"lm_head_part{k}" for k in range(5)]
    assert shards[-1].stop == vl.cfg.text.vocab_size and [s.name for s in prep.specs][-5:] == [s.name for s in shards]
    pkg = convert_stage(prep)
    for shard in shards[:-1]:  # the decode variants' InnerProducts get ncnn's packed (16-wide) kernels
        (line,) = [ln for ln in (pkg / "ncnn" / f"{shard.name}.decode.ncnn.param").read_text().splitlines()
                   if ln.startswith("InnerProduct")]
        assert int(line.split(" 0=")[1].split()[0]) % 16 == 0, line
    mods = open_ncnn_modules(pkg)
    ids = np.array([5, 100, 128000, 99999, 128265, 7])
    rows = with_tied_embedding(mods)[EMBED_NAME].run([ids.astype(np.int32)[None]])[0][0]
    np.testing.assert_array_equal(rows, vl.embed(ids))
    logits = forward_llm(mods, rows, LatentCache.empty(vl.cfg, len(rows)), vl.cfg)
    with torch.no_grad():
        ref = vl.llm(inputs_embeds=torch.from_numpy(rows)[None]).logits[0, -1].numpy()
    assert logits.shape == ref.shape
    assert np.abs(logits - ref).max() < 1e-4 * np.abs(ref).max()
