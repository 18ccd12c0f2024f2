"""The export split in torch: wrappers + host pipeline must reproduce the reference exactly enough
that greedy tokens are identical (a failure here is a split bug, not a conversion bug)."""

from __future__ import annotations

import numpy as np
import pytest

from ncnnport.contract import Tolerance
from ncnnport.models.youtu_vl.fixtures import FIXTURES, synthetic_image
from ncnnport.models.youtu_vl.pipeline import (LatentCache, encode_image, forward_llm, module_names,
                                               vision_inputs)
from ncnnport.models.youtu_vl.port import PORT, e2e_case
from ncnnport.models.youtu_vl.processor import process_image
from ncnnport.models.youtu_vl.specs import module_specs
from ncnnport.registry import LoadedModel
from ncnnport.runtime.session import TorchModule


@pytest.fixture(scope="module")
def loaded(tiny, tiny_folder):
    vl, tok = tiny
    return LoadedModel(name="youtu-vl", preset="tiny", ckpt=None, config=vl.cfg.to_json(), reference=vl,
                       extra={"tokenizer": tok, "folder": tiny_folder})


@pytest.fixture(scope="module")
def runners(loaded):
    return {s.name: TorchModule(s.build(), s.to_json()) for s in module_specs(loaded.reference)}


def test_spec_names_match_pipeline(loaded):
    specs = module_specs(loaded.reference)
    assert [s.name for s in specs] == module_names(loaded.reference.cfg)
    for s in specs:
        for t in s.inputs:
            assert t.shape[0] == 1


def test_spec_example_inputs_are_valid_at_all_sizes(loaded, runners):
    for spec in module_specs(loaded.reference):
        for sizes in spec.all_parity_sizes():
            outs = runners[spec.name].run(spec.example_inputs(sizes))
            assert all(np.isfinite(o).all() for o in outs), spec.name


def test_vision_segments_follow_full_attention_layers():
    from ncnnport.models.youtu_vl.config import real_config, tiny_config
    from ncnnport.models.youtu_vl.pipeline import vision_segments

    real = [(s.start, s.end, s.windowed) for s in vision_segments(real_config())]
    assert real == [(0, 7, True), (7, 8, False), (8, 15, True), (15, 16, False), (16, 23, True),
                    (23, 24, False), (24, 26, True), (26, 27, False)]
    tiny = vision_segments(tiny_config())
    assert [(s.start, s.end, s.windowed) for s in tiny] == [(0, 1, True), (1, 2, False), (2, 3, True),
                                                            (3, 4, False)]
    assert tiny[0].first and tiny[-1].last and not tiny[1].first and not tiny[1].last


def test_masked_and_segmented_vision_splits_agree(tiny, runners):
    vl, _ = tiny
    masked = {s.name: TorchModule(s.build(), s.to_json())
              for s in module_specs(vl, vision_mode="masked") if s.name in ("vision_tower", "merger")}
    assert "vision_seg0" not in masked
    for hw in [(520, 300), (180, 270)]:
        img = process_image(synthetic_image(*hw), vl.cfg.vision, vl.cfg.processor)
        a, _ = encode_image(runners, img, vl.cfg)
        b, _ = encode_image(masked, img, vl.cfg)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
        np.testing.assert_allclose(b, vl.vision_features(img), atol=1e-5, rtol=0)


def test_vision_window_inputs_are_permuted_and_inverse_restores_raster(tiny, runners):
    vl, _ = tiny
    img = process_image(synthetic_image(520, 300), vl.cfg.vision, vl.cfg.processor)
    vin = vision_inputs(img, vl.cfg)
    assert not np.array_equal(vin.perm, np.arange(vin.perm.size))
    assert not np.array_equal(vin.perm, np.argsort(vin.perm))
    np.testing.assert_array_equal(vin.pixel_values[0][np.argsort(vin.perm)], img.pixel_values)
    vision, merged = encode_image(runners, img, vl.cfg)
    np.testing.assert_allclose(vision, vl.vision_features(img), atol=1e-5, rtol=0)
    np.testing.assert_allclose(merged, vl.merge(vl.vision_features(img)), atol=3e-5, rtol=0)


def test_dummy_cache_row_is_invisible(tiny, runners):
    vl, _ = tiny
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((9, vl.cfg.text.hidden_size)).astype(np.float32)
    a = forward_llm(runners, emb, LatentCache.empty(vl.cfg, 9), vl.cfg)
    noisy = LatentCache.empty(vl.cfg, 9)
    for i in range(vl.cfg.text.num_hidden_layers):
        for view in noisy.past(i):  # the dummy row, written through the cache's own views
            view[...] = rng.standard_normal(view.shape).astype(np.float32) * 10
    b = forward_llm(runners, emb, noisy, vl.cfg)
    np.testing.assert_array_equal(a, b)


def test_chunked_prefill_equals_one_shot(tiny, runners):
    """Prefill in two chunks then decode must equal one prefill: positions and masks continue."""
    vl, _ = tiny
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((12, vl.cfg.text.hidden_size)).astype(np.float32)
    one = forward_llm(runners, emb, LatentCache.empty(vl.cfg, 12), vl.cfg)
    cache = LatentCache.empty(vl.cfg, 12)
    forward_llm(runners, emb[:5], cache, vl.cfg)
    forward_llm(runners, emb[5:11], cache, vl.cfg)
    two = forward_llm(runners, emb[11:], cache, vl.cfg)
    assert cache.seen == 12 and cache.past(0)[0].shape[2] == 13
    np.testing.assert_allclose(one, two, atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", ["grid_12x18", "strip_32x2048", "text_only"])
def test_split_generation_matches_reference(loaded, runners, name):
    fx = {f.name: f for f in FIXTURES}[name]
    recs = e2e_case(loaded, runners, fx.name, fx.image(), fx.prompt, lambda s: Tolerance(), 64)
    by_stage = {r["stage"]: r for r in recs}
    assert by_stage["tokens"]["tokens_compared"] == 64
    assert all(r["passed"] for r in recs), [(r["stage"], r["reason"]) for r in recs]
    assert len(set(by_stage["tokens"]["reference_tokens"])) >= 8


def test_run_streams_text_and_stops_at_eos(loaded, runners, capsys, tmp_path):
    import argparse

    img_path = tmp_path / "img.png"
    synthetic_image(180, 270).save(img_path)
    p = argparse.ArgumentParser()
    PORT.add_run_arguments(p)
    args = p.parse_args(["--image", str(img_path), "--prompt", "What is this?", "--max-new-tokens", "12",
                           "--show-special"])
    assert PORT.run(loaded, runners, args) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.prompt import encode_prompt

    vl, tok = loaded.reference, loaded.extra["tokenizer"]
    img = process_image(synthetic_image(180, 270), vl.cfg.vision, vl.cfg.processor)
    ids = encode_prompt(tok, "What is this?", img.num_tokens, vl.cfg.system_prompt)
    ref = reference_generate(vl, ids, img, 12)
    want = tok.decode([t for t in ref.tokens if t != 128001], skip_special_tokens=False)
    assert len(want) > 0 and out == want + "\n"


def test_real_preset_loads_lazily_with_layers():
    """The seeded real preset: 4B config, nothing materialised by load or by listing the split."""
    loaded = PORT.load("real", None, layers=1)
    vl = loaded.reference
    assert loaded.config["num_hidden_layers"] == 1 and vl.cfg.vision.num_hidden_layers == 27
    names = [s.name for s in PORT.module_specs(loaded)]
    assert names[-8:] == ["llm_layer0"] + [f"lm_head_part{k}" for k in range(7)] and "merger" in names
    assert not vl.is_materialized and not vl.source.reads
    sizes = PORT.module_weight_bytes(loaded)
    assert max(sizes, key=sizes.get).startswith("lm_head_part")


def test_port_is_registered():
    from ncnnport.registry import get_port

    assert get_port("youtu-vl") is PORT


@pytest.mark.parametrize("limit", [512 << 20, 12 << 20, 3 << 20])
def test_head_shards_have_packable_row_counts(limit):
    """Every head shard but a last one of the ``V % 16`` leftover rows has a multiple of 16 rows,
    so ncnn's InnerProduct (fp16 weights) runs its packed kernel; the shards tile the vocabulary
    and stay under the byte limit. Equal shards of the real vocabulary had 47231 rows each."""
    from ncnnport.models.youtu_vl.config import preset_config
    from ncnnport.models.youtu_vl.pipeline import HEAD_ROW_ALIGN, head_shards

    for name in ("real", "tiny"):
        t = preset_config(name).text
        shards = head_shards(preset_config(name), limit)
        if len(shards) == 1:
            continue
        assert [s.start for s in shards[1:]] == [s.stop for s in shards[:-1]]
        assert shards[0].start == 0 and shards[-1].stop == t.vocab_size
        rows = [s.stop - s.start for s in shards]
        assert all(r % HEAD_ROW_ALIGN == 0 for r in rows[:-1])
        assert rows[-1] % HEAD_ROW_ALIGN in (0, t.vocab_size % HEAD_ROW_ALIGN)
        assert max(4 * r * t.hidden_size for r in rows) <= limit
