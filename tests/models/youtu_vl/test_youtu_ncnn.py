"""Converted ncnn graphs: loadable params, per-module parity at every spec size, e2e tokens."""

from __future__ import annotations

import numpy as np
import pytest

from ncnnport.parity.policy import Policy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def converted(built):
    """Every module of the session's converted package (conftest ``built``), ncnn and torch."""
    from ncnnport.fsutil import read_json
    from ncnnport.stages import torch_modules
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    receipts = {c["module"]: c for c in read_json(pkg / "manifest.json")["pnnx_commands"]}
    return prep.specs, open_ncnn_modules(pkg), torch_modules(prep), receipts


def _policy() -> Policy:
    from ncnnport.models.youtu_vl.port import PORT

    return Policy.load(PORT.policy_path)


def test_params_have_only_native_layers(converted):
    _, _, _, receipts = converted
    for name, r in receipts.items():
        bad = [t for t in r["layer_types"] if "." in t]
        assert not bad, f"{name}: {bad}"
        assert "fp16=0" in r["command"]
    assert receipts["vision_seg0"]["layer_types"].get("SDPA") == 1       # one tiny block per segment
    assert "RotaryEmbed" in receipts["vision_seg0"]["layer_types"]        # rotate_half fused
    assert "SDPA" not in receipts["llm_layer0"]["layer_types"]          # explicit scores, no K/V repack


def _readers(graph, blob: str) -> list[str]:
    """Types of the layers that read ``blob``, looking through ncnn's Split fan-outs."""
    found = []
    for layer in graph.layers:
        if blob in layer.inputs:
            found += [t for out in layer.outputs for t in _readers(graph, out)] if layer.type == "Split" \
                else [layer.type]
    return found


@pytest.mark.parametrize("param", ["llm_layer0.ncnn.param", "llm_layer0.decode.ncnn.param"])
def test_layer_graphs_only_read_the_cache(built, param):
    """The decode step must cost the same at P=1000 as at P=100 apart from reading the cache: the
    past latent and rope rows go straight into matrix products (no Concat copying the past, no SDPA
    repacking it, no transpose copy), and the graph returns only the new rows."""
    from ncnnport.package.param_file import read_param

    _, pkg = built
    graph = read_param(pkg / "ncnn" / param)
    assert not any(layer.type in ("SDPA", "Concat") and set(layer.inputs) & {"past_latent", "past_krot"}
                   for layer in graph.layers)
    for blob in ("past_latent", "past_krot"):
        readers = _readers(graph, blob)
        assert readers and set(readers) == {"MatMul"}, f"{param}: {blob} read by {readers}"


def test_decode_step_borrows_the_cache_and_writes_one_row(built, converted):
    """A step hands the cache views to ncnn without a copy and returns one new row per layer."""
    from ncnnport.models.youtu_vl.pipeline import LatentCache, forward_layers, layer_name
    from ncnnport.runtime.zero_copy import ZeroCopyRunner

    prep, _ = built
    cfg = prep.loaded.reference.cfg
    _, ncnn_mods, _, _ = converted
    seen: list[ZeroCopyRunner] = []

    class Spy(ZeroCopyRunner):
        def run(self, arrays):
            seen.append(self)
            return super().run(arrays)

    runners = {layer_name(i): Spy(ncnn_mods[layer_name(i)]) for i in range(cfg.text.num_hidden_layers)}
    cache = LatentCache.empty(cfg, 40)
    h = np.random.default_rng(0).standard_normal((1, 30, cfg.text.hidden_size)).astype(np.float32)
    forward_layers(runners, h, cache, cfg)
    forward_layers(runners, h[:, :1], cache, cfg)
    assert cache.seen == 31 and len(seen) == 2 * cfg.text.num_hidden_layers
    assert all(r.borrowed == ["past_latent", "past_krot"] for r in seen)


def test_every_module_matches_torch_at_every_size(converted):
    from ncnnport.parity.local import local_parity

    specs, ncnn_mods, torch_mods, _ = converted
    policy = _policy()
    for spec in specs:
        spec.tolerances = policy.module(spec.name)
        rows = local_parity(spec, torch_mods[spec.name], ncnn_mods[spec.name], policy.default())
        assert len(rows) >= len(spec.outputs) * len(spec.all_parity_sizes())
        failed = [(r.get("case"), r.get("output"), r.get("reason")) for r in rows if not r["passed"]]
        assert not failed, f"{spec.name}: {failed}"


def test_masked_vision_tower_graph(tiny, tmp_path):
    """The alternative single-graph split (window mask input) converts and matches the reference."""
    from ncnnport.convert.pnnx_runner import convert_module
    from ncnnport.export.tracing import export_module
    from ncnnport.models.youtu_vl.fixtures import synthetic_image
    from ncnnport.models.youtu_vl.pipeline import VISION, vision_inputs
    from ncnnport.models.youtu_vl.processor import process_image
    from ncnnport.models.youtu_vl.specs import module_specs
    from ncnnport.metrics import compare
    from ncnnport.runtime.session import NcnnModule

    vl, _ = tiny
    spec = next(s for s in module_specs(vl, vision_mode="masked") if s.name == VISION)
    rec = export_module(spec, tmp_path / "ts")
    receipt = convert_module(rec, tmp_path / "ts" / f"{VISION}.pt", tmp_path / "ncnn")
    assert receipt["layer_types"].get("SDPA") == vl.cfg.vision.num_hidden_layers
    mod = NcnnModule(tmp_path / "ncnn" / f"{VISION}.ncnn.param", tmp_path / "ncnn" / f"{VISION}.ncnn.bin", rec)
    for hw in [(520, 300), (200, 230)]:
        img = process_image(synthetic_image(*hw), vl.cfg.vision, vl.cfg.processor)
        vin = vision_inputs(img, vl.cfg)
        (out,) = mod.run([vin.pixel_values, vin.cos, vin.sin, vin.window_mask()])
        raster = out[0][np.argsort(vin.perm)]
        stats = compare(vl.vision_features(img), raster)
        assert stats.cosine > 0.999999 and stats.max_abs < 1e-4 * stats.ref_absmax, stats


def test_windows_side_by_side_equal_one_by_one(built, tiny):
    """The vision segments on 4 threads: window segments (concurrent_calls 4) run their windows
    4 at a time on one thread each, full-attention segments one call on 4 threads. The tower
    output equals the 1-thread run's to fp32 roundoff (the full segments' Gemm tiles follow the
    thread count)."""
    from ncnnport.metrics import compare
    from ncnnport.models.youtu_vl.fixtures import synthetic_image
    from ncnnport.models.youtu_vl.pipeline import MERGER, encode_image, vision_segments
    from ncnnport.models.youtu_vl.processor import process_image
    from ncnnport.runtime.concurrent_calls import CallSplit
    from ncnnport.runtime.lazy_modules import open_ncnn_modules
    from ncnnport.runtime.options import FP32

    vl, _ = tiny
    _, pkg = built
    names = [s.name for s in vision_segments(vl.cfg)] + [MERGER]
    one, four = (open_ncnn_modules(pkg, names, FP32.with_(num_threads=t)) for t in (1, 4))
    for seg in vision_segments(vl.cfg):
        assert four[seg.name].split == (CallSplit(4, 1) if seg.windowed else CallSplit(1, 4)), seg.name
    img = process_image(synthetic_image(520, 300), vl.cfg.vision, vl.cfg.processor)  # 3 x 2 windows
    (a, _), (b, _) = encode_image(one, img, vl.cfg), encode_image(four, img, vl.cfg)
    stats = compare(a, b)
    assert stats.max_abs <= 1e-5 * stats.ref_absmax and stats.worst_row_cosine > 0.999999, stats


@pytest.mark.parametrize("name", ["grid_12x18", "six_windows", "tiny_5x7", "text_only"])
def test_ncnn_generation_matches_reference(built, converted, name):
    from ncnnport.models.youtu_vl.fixtures import FIXTURES
    from ncnnport.models.youtu_vl.port import e2e_case

    prep, _ = built
    _, ncnn_mods, _, _ = converted
    fx = {f.name: f for f in FIXTURES}[name]
    policy = _policy()
    recs = e2e_case(prep.loaded, ncnn_mods, fx.name, fx.image(), fx.prompt,
                    lambda s: policy.stage(s), 64, gate=policy.token_gate("fp32"))
    assert all(r["passed"] for r in recs), [(r["stage"], r["reason"]) for r in recs]
    tokens = next(r for r in recs if r["stage"] == "tokens")
    assert tokens["tokens_matched"] == 64
    assert tokens["teacher_forced"]["top1_agreement"] == 1.0 and tokens["teacher_forced"]["steps"] == 64
    stages = {r["stage"] for r in recs}
    assert ("vision" in stages) == (fx.size_hw is not None)
