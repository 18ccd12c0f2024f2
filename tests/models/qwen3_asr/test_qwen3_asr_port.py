"""The Qwen3-ASR port end to end: export, convert, local + e2e parity, run, check, bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from ncnnport.targets import Target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    from ncnnport.stages import convert_stage, prepare

    root = tmp_path_factory.mktemp("build")
    prep = prepare(Target("qwen3-asr", "tiny", None, root))
    pkg = convert_stage(prep)
    return prep, pkg


@pytest.fixture(scope="session")
def summary(built):
    from ncnnport.drivers.parity import run_parity
    prep, pkg = built
    return run_parity(prep, pkg)


def test_every_local_and_e2e_gate_passes(summary):
    failed = [r for r in summary["modules"] + summary["e2e"] if not r["passed"]]
    assert not failed, failed[:3]
    assert summary["gates_passed"]
    cases = {r["name"]: set() for r in summary["modules"]}
    for r in summary["modules"]:
        cases[r["name"]].add(r["case"])
    for name in ("audio_layer0", "prefill_layer1", "decode_layer0", "embed"):
        synthetic = {c for c in cases[name] if not c.startswith("recorded")}
        assert len(synthetic) >= 2, (name, cases[name])   # >= 2 sizes of the dynamic axis


def test_tokens_match_transformers_generate_for_64_tokens_on_every_fixture(summary):
    toks = [r for r in summary["e2e"] if r["kind"] == "tokens" and r["stage"] == "tokens"]
    fixtures = {r["fixture"].split("[")[0] for r in toks}
    assert {"speech_2s", "speech_12s", "speech_65s", "speech_65s_cut25"} <= fixtures
    for r in toks:
        assert r["tokens_compared"] >= 64 and r["tokens_matched"] == r["tokens_compared"], r["fixture"]
        assert len(set(r["reference_tokens"])) > 8, "tiny preset degenerated to repeated tokens"
    cut = [r for r in toks if r["fixture"].startswith("speech_65s_cut25[")]
    assert len(cut) == 3  # 65 s at a 25 s limit: the cut rule made three chunks


def test_windows_and_log_mel_are_measured(summary):
    stages = {(r["fixture"], r["stage"]): r for r in summary["e2e"]}
    assert stages[("speech_65s", "audio_embeds")]["windows"] >= 6
    mel = stages[("speech_2s", "log_mel")]
    assert mel["max_abs"] <= max(1e-5, 1.1 * mel["hf_float32_noise"])
    for r in (r for r in summary["e2e"] if r["stage"] == "prefill_logits"):
        # gated at max(1e-4 relative, 4x transformers' own fp32-vs-float64 error on that prompt)
        assert 0 < r["hf_float32_noise"] and r["noise_factor"] == 4.0
        assert r["tolerance"]["max_abs_floor"] == max(r["policy_floor"], 4.0 * r["hf_float32_noise"])
        assert r["ncnn_vs_float64_max_abs"] > 0 and r["max_abs"] <= 1e-4 * r["ref_absmax"]


def test_manifest_records_versions_commands_and_check_catches_tampering(built, tmp_path):
    import shutil

    from ncnnport.package.manifest import check_package
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    _, pkg = built
    manifest = json.loads((pkg / "manifest.json").read_text())
    assert manifest["versions"]["pnnx"] == "20261020"
    assert all("fp16=0" in c["command"] for c in manifest["pnnx_commands"])
    assert check_package(pkg) == []
    copy = tmp_path / "pkg"
    shutil.copytree(pkg, copy)
    param = copy / "ncnn" / "decode_layer0.ncnn.param"
    param.write_text(param.read_text().replace("MatMul", "MatMul ", 1))
    assert any("decode_layer0.ncnn.param" in p for p in check_package(copy))
    with pytest.raises(RuntimeError, match="does not match its manifest"):
        open_ncnn_modules(copy)


def test_static_decode_trace_needs_the_reshape_patch(built, tmp_path):
    """A decode graph traced at ONE cache length with HF repeat_kv (as public ports did) fails at
    other lengths; the declarative Reshape -> -1 patch makes it pass everywhere."""
    from ncnnport.contract import Tolerance
    from ncnnport.convert.pnnx_runner import convert_module
    from ncnnport.export.tracing import export_module
    from ncnnport.models.qwen3_asr.specs import static_reshape_decode_spec
    from ncnnport.parity.local import local_parity
    from ncnnport.runtime.session import NcnnModule, TorchModule

    prep, _ = built
    model = prep.loaded.reference
    results = {}
    for patched in (False, True):
        spec = static_reshape_decode_spec(model, past=12, patched=patched)
        out = tmp_path / ("patched" if patched else "plain")
        rec = export_module(spec, out)
        receipt = convert_module(rec, out / rec["torchscript"], out)
        mod = NcnnModule(out / "decode_static.ncnn.param", out / "decode_static.ncnn.bin", rec)
        rows = local_parity(spec, TorchModule(spec.build(), rec), mod, Tolerance())
        results[patched] = {r["case"]: r["passed"] for r in rows if r["output"] == "hidden"}
        if patched:
            assert len(receipt["patches"][0]["changed"]) == 2 * 2  # k and v of both layers
    assert results[False]["past=12"] and not results[False]["past=18"] and not results[False]["past=3"]
    assert all(results[True].values()), results[True]


def test_run_cli_transcribes_a_stereo_8khz_float_file(built, tmp_path):
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

    wave = synth_speechlike(3.0, seed=7)
    stereo8k = np.stack([wave[::2], wave[::2] * 0.5], axis=1).astype(np.float32)
    path = tmp_path / "clip.wav"
    sf.write(path, stereo8k, 8000, subtype="FLOAT")
    prep, _ = built
    out = subprocess.run([sys.executable, "-m", "ncnnport.cli", "run", "qwen3-asr", "--build-dir",
                          str(prep.target.build_root), "--audio", str(path), "--max-new-tokens", "12"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "language:" in out.stdout and "text:" in out.stdout


@pytest.mark.parametrize("content,match", [(None, "not found|does not exist|No such"),
                                           (b"not audio at all" * 10, "audio"),])
def test_run_cli_bad_audio_is_a_clear_error(built, tmp_path, content, match):
    prep, _ = built
    path = tmp_path / "bad.wav"
    if content is not None:
        path.write_bytes(content)
    out = subprocess.run([sys.executable, "-m", "ncnnport.cli", "run", "qwen3-asr", "--build-dir",
                          str(prep.target.build_root), "--audio", str(path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "bad.wav" in out.stderr and "Traceback" not in out.stderr


def test_prompt_past_max_positions_is_refused(built):
    from ncnnport.models.qwen3_asr.runtime import make_pipeline
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    pipe = make_pipeline(open_ncnn_modules(pkg), prep.loaded.reference)
    ids = np.zeros(10, np.int32)
    with pytest.raises(ValueError, match="max positions"):
        pipe.generate(ids, np.zeros((0, 96), np.float32), max_new_tokens=pipe.d["max_positions"])


def test_perturbed_layer_weights_are_caught_and_named_as_first_divergence(built, tmp_path):
    """A test double: prefill_layer1's ncnn weights scaled by 1.001. Local parity must fail for
    that module only, and the first-divergence trace must name it."""

    from ncnnport.models.qwen3_asr.features import extract_features
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
    from ncnnport.models.qwen3_asr.port import PORT
    from ncnnport.models.qwen3_asr.prompt import build_prompt
    from ncnnport.models.qwen3_asr.reference import greedy_generate
    from ncnnport.models.qwen3_asr.runtime import ChunkRun
    from ncnnport.models.qwen3_asr.chunking import split_audio
    from ncnnport.parity.local import local_parity
    from ncnnport.registry import E2EContext
    from ncnnport.stages import torch_modules
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    from tests.perturb import perturbed_package

    bad = perturbed_package(pkg, tmp_path / "pkg", ["prefill_layer1"])
    ncnn_mods = open_ncnn_modules(bad)
    torch_mods = torch_modules(prep)

    default = prep.policy.default()
    verdicts = {s.name: all(r["passed"] for r in local_parity(s, torch_mods[s.name], ncnn_mods[s.name], default))
                for s in prep.specs if s.name.startswith(("prefill", "decode", "audio_layer"))}
    assert not verdicts["prefill_layer1"]
    assert all(v for k, v in verdicts.items() if k != "prefill_layer1"), verdicts

    wave = synth_speechlike(2.0, seed=1)
    chunk = split_audio(wave)[0]
    processor = prep.loaded.extra["processor"]
    prompt = build_prompt(processor, chunk.samples)
    feats = extract_features(chunk.samples)
    ref_ids, _ = greedy_generate(prep.loaded.reference, prompt, 8, min_new_tokens=8)
    run = ChunkRun(chunk, prompt.input_ids, feats.features, feats.mask, {}, None, None)
    ctx = E2EContext(prep.loaded, ncnn_mods, torch_mods, bad, prep.policy)
    trace = PORT._trace("perturbed", prep.loaded.reference, run, ref_ids, ctx)
    assert not trace["passed"]
    assert trace["first_divergence"]["module"] == "prefill_layer1"
    by_module = {m["module"]: m for m in trace["modules"]}
    assert by_module["prefill_layer1"]["local_max_abs"] > 10 * by_module["prefill_layer0"]["local_max_abs"]
    assert trace["worst_tensors"] and (tmp_path / "trace").is_dir()


def test_encoder_and_decode_interleaved_stay_identical_flat_and_bounded(built):
    """100 rounds of audio-encoder calls alternating with decode steps, each on its own sessions:
    outputs bit-identical to the isolated calls and bounded RSS. Latency drift is a timing
    judgement, so it is gated by the nightly stability bench (``ncnnport nightly``), not here:
    the gate itself is tested with load and slowdown doubles in tests/runtime/test_bench.py."""
    from ncnnport.runtime.bench import interleave
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    calls = {}
    for stage, size in (("audio_encoder", "2"), ("decode", "16")):
        calls[stage] = prep.port.bench_call(prep.loaded, open_ncnn_modules(pkg), stage, size)
    res = interleave(calls, rounds=100, warmup=3)
    for name, r in res.items():
        assert r.identical_outputs, (name, r.mismatched_calls[:5])
        assert r.rss_growth_mb < 16, (name, r.rss_growth_mb)


def test_submodel_sessions_share_no_mutable_state(built):
    """Each graph gets its own Net and Option; a setting changed on one is invisible to the others,
    and two pipelines over the same package keep separate KV caches."""
    from ncnnport.models.qwen3_asr.bench import decode_inputs
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    mods = open_ncnn_modules(pkg)
    nets = [m.net for m in mods.values()]
    assert len({id(n) for n in nets}) == len(nets)
    mods["audio_layer0"].net.opt.num_threads = 2
    assert all(m.net.opt.num_threads == 1 for n, m in mods.items() if n != "audio_layer0")
    # a decode layer's answer does not depend on what another session computed before
    layer = mods["decode_layer0"]
    inputs = decode_inputs(prep.loaded.reference, 16)
    first = layer.run(inputs)
    mods["audio_head"].run([np.zeros((1, 104, 64), np.float32)])
    mods["decode_layer1"].run(decode_inputs(prep.loaded.reference, 40))
    again = layer.run(inputs)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_parity_cli_takes_the_users_own_audio(built, tmp_path):
    """`ncnnport parity qwen3-asr --input my.flac` adds the user's file to the e2e fixtures."""
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike

    path = tmp_path / "mine.flac"
    sf.write(path, (synth_speechlike(1.5, seed=11) * 32767).astype(np.int16), 22050)
    prep, _ = built
    out = subprocess.run([sys.executable, "-m", "ncnnport.cli", "parity", "qwen3-asr", "--build-dir",
                          str(prep.target.build_root), "--input", str(path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "input:mine.flac" in out.stdout and "PASSED" in out.stdout
    summary = json.loads((prep.target.report_dir / "summary.json").read_text())
    mine = [r for r in summary["e2e"] if r["fixture"] == "input:mine.flac" and r["stage"] == "tokens"]
    assert mine and mine[0]["passed"] and mine[0]["tokens_compared"] >= 64


def test_decode_graph_reads_the_cache_in_place_and_returns_only_the_new_rows(built):
    """No Concat copying the past, K/V read straight from the graph inputs by MatMul, projections
    as InnerProduct (2-D hidden: the layer that keeps fp16 weights), no pnnx leftovers."""
    from ncnnport.package.param_file import read_param

    _, pkg = built
    graph = read_param(pkg / "ncnn" / "decode_layer0.ncnn.param")
    types = graph.layer_types()
    assert "Concat" not in types and "Gemm" not in types and "SDPA" not in types
    assert types.count("InnerProduct") == 7 and not graph.unsupported_layers()
    readers = {b: [layer.type for layer in graph.layers if b in layer.inputs] for b in ("past_k", "past_v")}
    assert readers == {"past_k": ["MatMul"], "past_v": ["MatMul"]}
    spec = json.loads((pkg / "specs" / "decode_layer0.spec.json").read_text())
    assert [o["shape"] for o in spec["outputs"]][1:] == [[1, 2, 1, 24]] * 2   # one new row of K and V
    assert read_param(pkg / "ncnn" / "lm_head.ncnn.param").layer_types() == ["Input", "RMSNorm", "InnerProduct"]


def test_generate_borrows_the_cache_and_matches_the_copying_path(built):
    """The ncnn pipeline hands the cache to ncnn without a copy; the same package run through a
    plain (copying) runner gives bit-identical tokens and logits."""
    from ncnnport.models.qwen3_asr.features import extract_features
    from ncnnport.models.qwen3_asr.fixtures import synth_speechlike
    from ncnnport.models.qwen3_asr.prompt import build_prompt
    from ncnnport.models.qwen3_asr.runtime import make_pipeline
    from ncnnport.runtime.recording import RecordingRunner
    from ncnnport.runtime.zero_copy import ZeroCopyRunner
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    mods = open_ncnn_modules(pkg)
    fast = make_pipeline(mods, prep.loaded.reference)
    plain = make_pipeline({n: RecordingRunner(m, limit=0) for n, m in mods.items()}, prep.loaded.reference)
    assert all(isinstance(d, ZeroCopyRunner) for d in fast.decoders)
    assert not any(isinstance(d, ZeroCopyRunner) for d in plain.decoders)
    wave = synth_speechlike(2.0, seed=3)
    prompt = build_prompt(prep.loaded.extra["processor"], wave)
    feats = extract_features(wave)
    emb = fast.encode(feats.features, feats.mask)["audio_embeds"]
    a = fast.generate(prompt.input_ids, emb, 24, keep_logits=True, min_new_tokens=24)
    b = plain.generate(prompt.input_ids, emb, 24, keep_logits=True, min_new_tokens=24)
    assert fast.decoders[0].borrowed == ["past_k", "past_v"]
    assert a.tokens == b.tokens and len(a.tokens) == 24
    assert all(np.array_equal(x, y) for x, y in zip(a.step_logits, b.step_logits))


def test_decode_step_beyond_the_cache_capacity_is_a_clear_error(built):
    from ncnnport.models.qwen3_asr.bench import filled_cache
    from ncnnport.models.qwen3_asr.runtime import make_pipeline
    from ncnnport.runtime.preallocated_cache import CacheError
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    pipe = make_pipeline(open_ncnn_modules(pkg), prep.loaded.reference)
    cache = filled_cache(pipe, 9)   # capacity 10
    h = np.zeros((1, pipe.d["hidden"]), np.float32)
    pipe.decode_step(h, cache)
    with pytest.raises(CacheError, match="qwen3-asr decoder: KV cache overflow at layer 0: .* capacity of 10"):
        pipe.decode_step(h, cache)


def test_bench_under_fp16_storage_runs_the_same_path_with_fp16_weights(built):
    """``bench --precision fp16-storage`` (make bench-perf) opens the graphs with fp16 InnerProduct
    weights: the same ``token`` work, different logits, half the Linear bytes in the bound."""
    from ncnnport.models.qwen3_asr.bench import stage_bytes
    from ncnnport.runtime import precision
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    port, loaded = prep.port, prep.loaded
    half = precision.get("fp16-storage")
    assert set(port.bench_stages()) == {"audio_encoder", "decode", "token"}
    assert set(port.bench_perf_stages()) == {"token", "decode"}
    fp32 = port.bench_call(loaded, open_ncnn_modules(pkg), "token", "20")
    fp16 = port.bench_call(loaded, open_ncnn_modules(pkg, options=half.options()), "token", "20")
    a, b = fp32()[0], fp16()[0]
    assert a.shape == b.shape == (loaded.reference.config.text_config.vocab_size,)
    assert not np.array_equal(a, b)   # fp16 weights really are in use
    assert np.array_equal(fp16()[0], b)   # fixed inputs: repeated calls are identical
    assert int(a.argmax()) == int(b.argmax())
    w32, w16 = stage_bytes(loaded.reference, "token", "20"), stage_bytes(loaded.reference, "token", "20", half)
    assert port.bench_bytes(loaded, "token", "20", "fp16-storage") == w16
    # K and V x 2 layers x 2 KV heads x 20 positions x 24 wide, at 4 bytes; fp16 rows at 2
    assert w32["kv_cache"] == 2 * 2 * 2 * 20 * 24 * 4 and w16["kv_cache"] == w32["kv_cache"] // 2
    assert 0.5 < w16["weights"] / w32["weights"] < 0.52   # Linear weights at 2 bytes, norms and one embedding row at 4
