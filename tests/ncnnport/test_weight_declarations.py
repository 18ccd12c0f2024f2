"""Declared weight sources (``ModuleSpec.weights``): the generic coverage check at export, byte
counts from the declarations, and the source tensor names each spec JSON records."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ncnnport.contract import ModuleSpec, TensorSpec
from ncnnport.export.weights import (WeightCoverageError, beyond_layers, bind_weights, pattern_matches,
                                     spec_weight_bytes)
from ncnnport.fsutil import sha256_file
from ncnnport.lazy_weights import SafetensorsSource, TensorsSource
from ncnnport.registry import get_port

MODELS = ("qwen3-asr", "youtu-vl", "seedvr2")


def _spec(name: str, weights: tuple[str, ...], build=None) -> ModuleSpec:
    return ModuleSpec(name, build or (lambda: nn.Identity()), [TensorSpec("x", (1, 4))],
                      [TensorSpec("y", (1, 4))], weights=weights)


def _source(**aliases: str) -> TensorsSource:
    return TensorsSource({"emb.weight": torch.zeros(10, 4), "layers.1.w": torch.zeros(4, 4),
                          "layers.10.w": torch.zeros(4, 4), "norm.weight": torch.zeros(4)}, aliases=aliases)


# --- the generic check -------------------------------------------------------------------------
def test_a_prefix_stops_at_a_name_boundary_and_a_glob_matches_whole_names():
    assert pattern_matches("layers.1.w", "layers.1") and not pattern_matches("layers.10.w", "layers.1")
    assert pattern_matches("layers.10.w", "layers.*.w") and not pattern_matches("layers.1.w.bias", "layers.*.w")


def test_every_tensor_claimed_binds_the_stored_names_and_no_file_for_memory():
    specs = [_spec("a", ("emb", "layers.1")), _spec("b", ("layers.10", "norm"))]
    bind_weights(specs, _source(), {})
    assert specs[0].weight_tensors == ("emb.weight", "layers.1.w") and specs[0].weight_files == {}
    assert specs[0].to_json()["weights"] == {"patterns": ["emb", "layers.1"],
                                             "tensors": ["emb.weight", "layers.1.w"], "files": {}}


def test_an_unclaimed_tensor_fails_naming_it():
    specs = [_spec("a", ("emb", "layers.1")), _spec("b", ("norm",))]
    with pytest.raises(WeightCoverageError, match=r"tensor 'layers\.10\.w' .* read by no graph"):
        bind_weights(specs, _source(), {})


def test_an_unused_tensor_needs_a_reason_and_must_exist():
    specs = [_spec("a", ("emb", "layers.1", "norm"))]
    bind_weights(specs, _source(), {"layers.10": "dropped by --layers"})
    with pytest.raises(WeightCoverageError, match="gives no reason"):
        bind_weights(specs, _source(), {"layers.10": " "})
    with pytest.raises(WeightCoverageError, match=r"unused weight pattern 'layers\.11' matches no tensor"):
        bind_weights(specs, _source(), {"layers.10": "x", "layers.11": "y"})


def test_a_typod_pattern_fails_naming_module_and_pattern():
    specs = [_spec("a", ("emb", "layers.1", "layers.10")), _spec("b", ("nrom",))]
    with pytest.raises(WeightCoverageError, match=r"module b: weight pattern 'nrom' matches no tensor"):
        bind_weights(specs, _source(), {"norm": "unused here"})


def test_malformed_patterns_are_refused_when_the_spec_is_made():
    for bad in ("", " emb", "emb@3:3", "a@b@1:2"):
        with pytest.raises(ValueError, match="weight pattern"):
            _spec("a", (bad,))


def test_an_alias_claims_its_target_and_a_row_range_counts_its_rows():
    specs = [_spec("head0", ("norm", "head.weight@0:6")), _spec("head1", ("head.weight@6:10",)),
             _spec("rest", ("layers",))]
    src = _source(**{"head.weight": "emb.weight"})
    bind_weights(specs, src, {})
    assert specs[0].weight_tensors == ("norm.weight", "emb.weight")
    assert spec_weight_bytes(specs[0], src) == 4 * (4 + 6 * 4)
    assert spec_weight_bytes(specs[2], src) == 4 * 32
    with pytest.raises(WeightCoverageError, match="rows outside 0:10"):
        bind_weights([_spec("h", ("head.weight@6:11",)), *specs], src, {})


def test_export_refuses_a_build_that_reads_an_undeclared_tensor(tmp_path):
    from ncnnport.export.tracing import export_module

    src = _source()

    class Reads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(src.get("norm.weight"), requires_grad=False)

        def forward(self, x):
            return x * self.w

    specs = [_spec("a", ("emb", "layers"), build=Reads), _spec("b", ("norm",))]
    bind_weights(specs, src, {})
    with pytest.raises(WeightCoverageError, match=r"module a: build\(\) read 1 tensor.*norm\.weight"):
        export_module(specs[0], tmp_path)
    export_module(specs[1], tmp_path.parent / "b")  # the graph that declares it exports


def test_export_refuses_a_build_that_reads_less_than_it_declares(tmp_path):
    from ncnnport.export.tracing import export_module

    src = _source()

    class ReadsNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(src.get("norm.weight"), requires_grad=False)

        def forward(self, x):
            return x * self.w

    specs = [_spec("a", ("norm", "emb"), build=ReadsNorm), _spec("b", ("layers",))]
    bind_weights(specs, src, {})
    with pytest.raises(WeightCoverageError, match=r"module a: declares 1 tensor\(s\) build\(\) never read.*emb"):
        export_module(specs[0], tmp_path)


@pytest.mark.parametrize("model", MODELS)
def test_every_graph_build_reads_exactly_its_declared_tensors(model, tmp_path):
    """Built from a checkpoint folder (SeedVR2: its tiny preset saved as one), each graph reads
    from the source exactly the tensors its spec declares."""
    from ncnnport.export.weights import check_reads

    ckpt = None
    if model == "seedvr2":
        from ncnnport.models.seedvr2 import model as M
        M.save(M.from_preset("tiny"), tmp_path / "ck")
        ckpt = tmp_path / "ck"
    port = get_port(model)
    for spec in port.module_specs(port.load("tiny", ckpt)):
        before = dict(spec.weight_source.reads)
        spec.build()
        check_reads(spec, before)
        read = {n for n, k in spec.weight_source.reads.items() if k > before.get(n, 0)}
        assert read == set(spec.weight_tensors)


def test_beyond_layers_declares_only_the_dropped_layers():
    names = ["m.layers.0.w", "m.layers.1.w", "m.layers.2.w", "m.layers.10.w", "m.norm"]
    assert list(beyond_layers(names, "m.layers.{i}", 2)) == ["m.layers.2", "m.layers.10"]
    assert beyond_layers(names, "m.layers.{i}", 11) == {}


# --- the three models ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(model: str):
        if model not in cache:
            cache[model] = get_port(model).load("tiny", None)
        return cache[model]
    return get


@pytest.mark.parametrize("model", MODELS)
def test_every_graph_declares_weights_and_every_tensor_is_read_or_excused(model, loaded):
    port = get_port(model)
    specs = port.module_specs(loaded(model))  # raises on any gap
    source = port.weight_source(loaded(model))
    read = {t for s in specs for t in s.weight_tensors}
    assert read and read <= set(source.stored_names())
    assert all(s.weights for s in specs if s.name != "dit_attention")


def _sole_claim(specs, source) -> tuple[ModuleSpec, str]:
    """A spec and one of its patterns whose tensors no other spec reads."""
    from ncnnport.export.weights import select

    names = source.names()
    for spec in specs:
        others = {t for s in specs if s is not spec for t in s.weight_tensors}
        for w in spec.weights:
            hit = {source.resolve(n) for n in select(names, w.split("@")[0])}
            if hit and not hit & others:
                return spec, w
    raise AssertionError("every pattern is shared")


@pytest.mark.parametrize("model", MODELS)
def test_dropping_a_pattern_fails_naming_a_tensor(model, loaded):
    port, ld = get_port(model), loaded(model)
    source = port.weight_source(ld)
    victim, dropped = _sole_claim(port.module_specs(ld), source)
    specs = port._own("specs").module_specs(ld.reference)
    spec = next(s for s in specs if s.name == victim.name)
    spec.weights = tuple(w for w in spec.weights if w != dropped)
    with pytest.raises(WeightCoverageError, match=r"tensor '([^']+)' .*read by no graph") as err:
        bind_weights(specs, source, port.unused_weights(ld))
    assert pattern_matches(str(err.value).split("'")[1], dropped)


@pytest.mark.parametrize("model", MODELS)
def test_a_typod_pattern_fails_naming_the_module_and_the_pattern(model, loaded):
    port, ld = get_port(model), loaded(model)
    specs = port._own("specs").module_specs(ld.reference)
    victim = next(s for s in specs if s.weights)
    victim.weights = (*victim.weights, victim.weights[0] + "x")
    with pytest.raises(WeightCoverageError, match=rf"module {victim.name}: weight pattern '.*x' matches no tensor"):
        bind_weights(specs, port.weight_source(ld), port.unused_weights(ld))


def _old_qwen_bytes(model) -> dict[str, int]:
    """The per-model walk module_weight_bytes did before the declarations (kept as the oracle)."""
    from ncnnport.models.qwen3_asr.specs import dims

    d, b = dims(model), model.part_bytes
    tower, text = "model.audio_tower", "model.language_model"
    out = {"audio_conv": sum(b(f"{tower}.{n}") for n in ("conv2d1", "conv2d2", "conv2d3", "conv_out"))}
    out.update({f"audio_layer{i}": b(f"{tower}.layers.{i}") for i in range(d["audio_layers"])})
    out["audio_head"] = b(f"{tower}.ln_post") + b("model.multi_modal_projector")
    out["embed"] = b(f"{text}.embed_tokens")
    for i in range(d["layers"]):
        out[f"prefill_layer{i}"] = out[f"decode_layer{i}"] = b(f"{text}.layers.{i}")
    out["lm_head"] = b(f"{text}.norm") + b("lm_head")
    return out


def _old_youtu_bytes(vl) -> dict[str, int]:
    from ncnnport.models.youtu_vl.pipeline import EMBED, MERGER, head_shards, layer_name, vision_segments
    from ncnnport.models.youtu_vl.wrappers import TOWER

    cfg = vl.cfg
    paths: dict[str, list[str]] = {}
    for seg in vision_segments(cfg):
        paths[seg.name] = ([f"{TOWER}.embeddings"] if seg.first else []) + \
            [f"{TOWER}.encoder.layers.{i}" for i in range(seg.start, seg.end)] + \
            ([f"{TOWER}.post_layernorm"] if seg.last else [])
    paths[MERGER] = ["merger"]
    if not cfg.text.tie_word_embeddings:
        paths[EMBED] = ["model.embed_tokens"]
    for i in range(cfg.text.num_hidden_layers):
        paths[layer_name(i)] = [f"model.layers.{i}"]
    sizes = {name: sum(vl.part_bytes(p) for p in ps) for name, ps in paths.items()}
    for shard in head_shards(cfg):
        sizes[shard.name] = 4 * cfg.text.hidden_size * (1 + shard.stop - shard.start)
    return sizes


def _old_seedvr2_bytes(model) -> dict[str, int]:
    from ncnnport.models.seedvr2.specs import spec_parts

    return {name: model.view_bytes(root, parts) if parts else 0
            for name, (root, parts) in spec_parts(model.config).items()}


@pytest.mark.parametrize("model,old", [("qwen3-asr", _old_qwen_bytes), ("youtu-vl", _old_youtu_bytes),
                                       ("seedvr2", _old_seedvr2_bytes)])
def test_generic_bytes_equal_the_old_per_model_walks(model, old, loaded):
    ld = loaded(model)
    new = get_port(model).module_weight_bytes(ld)
    assert new == old(ld.reference) and sum(new.values()) > 0


def test_youtu_head_declares_the_norm_and_the_tied_table(loaded):
    ld = loaded("youtu-vl")
    t = ld.reference.cfg.text
    head = next(s for s in get_port("youtu-vl").module_specs(ld) if s.name.startswith("lm_head"))
    assert head.weights == ("model.norm", "lm_head.weight")
    assert "model.embed_tokens.weight" in head.weight_tensors  # tied: the alias resolves to the table
    assert get_port("youtu-vl").module_weight_bytes(ld)[head.name] == 4 * t.hidden_size * (1 + t.vocab_size)


def test_a_folder_loaded_spec_records_its_tensors_and_file_hash(loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("NCNNPORT_CACHE", str(tmp_path / "cache"))
    ld = loaded("qwen3-asr")
    source = ld.reference.source
    assert isinstance(source, SafetensorsSource)
    spec = next(s for s in get_port("qwen3-asr").module_specs(ld) if s.name == "decode_layer0")
    rec = spec.to_json()["weights"]
    assert rec["patterns"] == ["model.language_model.layers.0"]
    assert rec["tensors"] and all(t.startswith("model.language_model.layers.0.") for t in rec["tensors"])
    files = {Path(source.file_of(t)) for t in rec["tensors"]}
    assert rec["files"] == {p.name: sha256_file(p) for p in files}
    assert list((tmp_path / "cache" / "sha256").glob("*.json"))  # hashed once, then cached


@pytest.mark.parametrize("layers", [None, 1, 2])
def test_a_seedvr2_folder_cut_to_k_blocks_declares_what_the_cut_leaves(layers, tmp_path, monkeypatch):
    """A K-block cut of a checkpoint stores the later blocks and block K-1's text branch (unused
    in the last-block role); a whole one stores RoPE freqs: each is declared with its reason."""
    from ncnnport.models.seedvr2 import model as M

    monkeypatch.setenv("NCNNPORT_CACHE", str(tmp_path / "cache"))
    M.save(M.from_preset("tiny"), tmp_path / "ck")
    port = get_port("seedvr2")
    ld = port.load("tiny", tmp_path / "ck", layers=layers)
    specs = port.module_specs(ld)
    unused = port.unused_weights(ld)
    assert any(k.endswith(".freqs") for k in unused)
    if layers is not None:
        assert f"dit.blocks.{layers}" in unused and f"dit.blocks.{layers - 1}.mlp.txt" in unused
    out = next(s for s in specs if s.name == "dit_output").to_json()["weights"]
    assert out["files"] == {"dit.safetensors": sha256_file(tmp_path / "ck" / "dit.safetensors")}


@pytest.mark.parametrize("layers", [None, 1])
def test_qwen_official_layout_records_the_names_the_folder_stores(layers, tmp_path, monkeypatch):
    from ncnnport.models.qwen3_asr.checkpoint import load_checkpoint, write_official_folder
    from ncnnport.models.qwen3_asr.presets import preset_folder

    monkeypatch.setenv("NCNNPORT_CACHE", str(tmp_path / "cache"))
    model, processor = load_checkpoint(preset_folder("tiny", cache_dir=tmp_path / "presets"))
    folder = write_official_folder(model, processor, tmp_path / "official")
    port = get_port("qwen3-asr")
    ld = port.load("tiny", folder, layers=layers)
    spec = next(s for s in port.module_specs(ld) if s.name == "decode_layer0")
    stored = set(ld.reference.source.stored_names())
    assert spec.weight_tensors and set(spec.weight_tensors) <= stored
    assert not any(t.startswith("model.language_model.") for t in spec.weight_tensors)
