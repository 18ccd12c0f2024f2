"""The Youtu-VL port through the generic stages: teacher-forced tokens, first-divergence trace with a
perturbed layer, bench hooks, interleaved stability and per-module session isolation."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TRACE_TOKENS = 8


@pytest.fixture(scope="session")
def modules(built):
    from ncnnport.stages import torch_modules
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    return open_ncnn_modules(pkg), torch_modules(prep)


def _case(prep, name):
    from ncnnport.models.youtu_vl.fixtures import FIXTURES
    from ncnnport.models.youtu_vl.processor import process_image
    from ncnnport.models.youtu_vl.prompt import encode_prompt

    vl, tok = prep.loaded.reference, prep.loaded.extra["tokenizer"]
    fx = {f.name: f for f in FIXTURES}[name]
    image = fx.image()
    processed = None if image is None else process_image(image, vl.cfg.vision, vl.cfg.processor)
    ids = encode_prompt(tok, fx.prompt, None if processed is None else processed.num_tokens,
                        vl.cfg.system_prompt)
    return fx, processed, ids


# --- teacher forcing --------------------------------------------------------------------------
def test_forced_generation_feeds_the_given_tokens(built, modules):
    from ncnnport.models.youtu_vl.pipeline import generate

    prep, _ = built
    ncnn_mods, _ = modules
    cfg = prep.loaded.reference.cfg
    _, processed, ids = _case(prep, "grid_12x18")
    free = generate(ncnn_mods, cfg, ids, processed, 6, stop_at_eos=False, keep_logits=True)
    same = generate(ncnn_mods, cfg, ids, processed, 6, stop_at_eos=False, keep_logits=True,
                    forced=free.tokens)
    assert same.tokens == free.tokens
    assert all(np.array_equal(a, b) for a, b in zip(free.step_logits, same.step_logits))
    other = [(t + 1) % cfg.text.vocab_size for t in free.tokens]
    moved = generate(ncnn_mods, cfg, ids, processed, 10, stop_at_eos=False, keep_logits=True, forced=other)
    assert len(moved.tokens) == len(other)          # at most len(forced) steps
    assert np.array_equal(moved.step_logits[0], free.step_logits[0])  # step 0 sees only the prompt
    assert not np.array_equal(moved.step_logits[1], free.step_logits[1])


def test_decode_variants_serve_the_one_token_steps(built, modules):
    """Layers and head have an InnerProduct ``decode`` variant over the same .bin: in fp32 it
    generates the same tokens with logits within fp32 noise; with fp16 weights the step logits
    move (the fp16 path is really taken) but stay inside the fp16 budget, teacher-forced."""
    from ncnnport.models.youtu_vl.pipeline import generate
    from ncnnport.models.youtu_vl.specs import DECODE
    from ncnnport.parity.tokens import teacher_forced_stats
    from ncnnport.runtime.variants import with_variant

    prep, pkg = built
    ncnn_mods, _ = modules
    cfg = prep.loaded.reference.cfg
    assert not list((pkg / "ncnn").glob("*.decode.ncnn.bin"))  # one weight file per graph
    _, processed, ids = _case(prep, "grid_12x18")
    base = generate(ncnn_mods, cfg, ids, processed, 12, stop_at_eos=False, keep_logits=True)

    def swapped(options=None):
        mods = with_variant(ncnn_mods, DECODE, options)
        return {n: m for n, m in mods.items() if m is not ncnn_mods[n]}

    fp32 = swapped()
    assert sorted(fp32) == sorted([f"llm_layer{i}" for i in range(cfg.text.num_hidden_layers)] + ["lm_head"])
    same = generate(ncnn_mods, cfg, ids, processed, 12, stop_at_eos=False, keep_logits=True, decode_runners=fp32)
    assert same.tokens == base.tokens
    assert np.array_equal(same.step_logits[0], base.step_logits[0])  # the prompt still runs on Gemm
    assert max(np.abs(a - b).max() for a, b in zip(same.step_logits, base.step_logits)) < 1e-4
    half = swapped(ncnn_mods["lm_head"].options.with_(fp16_storage=True))
    forced = generate(ncnn_mods, cfg, ids, processed, 12, stop_at_eos=False, keep_logits=True,
                      forced=base.tokens, decode_runners=half)
    tf = teacher_forced_stats(base.step_logits, forced.step_logits)
    gate = prep.policy.token_gate("fp16")
    assert 0 < tf["logit_noise"] and tf["top1_agreement"] >= gate["min_top1"] and tf["kl_mean"] <= gate["max_kl_mean"], tf


def test_run_steps_on_decode_variants_exactly_when_the_precision_stores_fp16(built) -> None:
    """``run --precision`` opens every graph with its options; the one-token steps move to the
    InnerProduct decode variants only under fp16 storage, keeping the graphs' own options."""
    from ncnnport.models.youtu_vl.pipeline import decode_runners
    from ncnnport.runtime import precision
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    layers = [f"llm_layer{i}" for i in range(prep.loaded.reference.cfg.text.num_hidden_layers)]
    for name in ("fp32", "bf16"):
        assert decode_runners(open_ncnn_modules(pkg, options=precision.get(name).options())) is None
    half = precision.get("fp16-storage").options()
    steps = decode_runners(open_ncnn_modules(pkg, options=half))
    assert sorted(steps) == sorted(layers + ["lm_head"])
    assert all(m.name.endswith(".decode") and m.options == half for m in steps.values())


def test_e2e_records_teacher_forced_stats_and_the_trace(built, modules):
    from ncnnport.models.youtu_vl.port import e2e_case
    from ncnnport.registry import E2EContext

    prep, pkg = built
    ncnn_mods, torch_mods = modules
    fx, _, _ = _case(prep, "one_window")
    ctx = E2EContext(prep.loaded, ncnn_mods, torch_mods, pkg, prep.policy)
    recs = e2e_case(prep.loaded, ncnn_mods, fx.name, fx.image(), fx.prompt, prep.policy.stage, 16,
                    gate=prep.policy.token_gate("fp32"), trace_ctx=ctx)
    assert all(r["passed"] for r in recs), [(r["stage"], r["reason"]) for r in recs if not r["passed"]]
    tokens = next(r for r in recs if r["stage"] == "tokens")
    tf = tokens["teacher_forced"]
    assert tf["steps"] == 16 and tf["top1_agreement"] == 1.0 and tf["top5_overlap"] == 1.0
    assert 0 < tf["logit_noise"] < 1e-3 and tf["kl_mean"] < 1e-8
    assert tokens["logit_noise"] == tf["logit_noise"] and tokens["gate"] == {"mode": "exact"}
    trace = next(r for r in recs if r["stage"] == "first_divergence")
    n_layers = prep.loaded.reference.cfg.text.num_hidden_layers
    by_module = {m["module"]: m for m in trace["modules"]}
    assert trace["first_divergence"] is None
    assert by_module["llm_layer0"]["calls"] == 16 and by_module["lm_head"]["calls"] == 16
    assert by_module["text_embed"]["calls"] == 16 and by_module["text_embed"]["local_max_abs"] == 0.0
    embeds = next(r for r in recs if r["stage"] == "text_embeds")
    assert embeds["host_lookup"] and embeds["max_abs"] == 0.0
    assert trace["calls_compared"] >= 16 * (3 * n_layers + 2)


def test_teacher_forced_gate_judges_reduced_precision_modes(built):
    """The fp16/bf16/fp16_weights modes have teacher-forced token gates; fp32 stays exact."""
    prep, _ = built
    assert prep.policy.token_gate("fp32") == {"mode": "exact"}
    for mode in ("fp16", "bf16", "fp16_weights"):
        gate = prep.policy.token_gate(mode)
        assert gate["mode"] == "teacher_forced" and 0.5 < gate["min_top1"] <= 1 and gate["max_kl_mean"] > 0
        assert prep.policy.default(mode).min_cosine < prep.policy.default("fp32").min_cosine


# --- first divergence -------------------------------------------------------------------------
def test_perturbed_layer_weights_are_caught_and_named_as_first_divergence(built, modules, tmp_path):
    """A test double: llm_layer1's ncnn weights scaled by 1.001. Local parity must fail for that
    module only, and the first-divergence trace must name it."""

    from ncnnport.models.youtu_vl.model import reference_generate
    from ncnnport.models.youtu_vl.port import trace_record
    from ncnnport.parity.local import local_parity
    from ncnnport.registry import E2EContext
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    _, torch_mods = modules
    from tests.perturb import perturbed_package

    bad = perturbed_package(pkg, tmp_path / "pkg", ["llm_layer1"])
    ncnn_mods = open_ncnn_modules(bad)

    default = prep.policy.default()
    verdicts = {s.name: all(r["passed"] for r in local_parity(s, torch_mods[s.name], ncnn_mods[s.name], default))
                for s in prep.specs}
    assert not verdicts["llm_layer1"]
    assert all(v for k, v in verdicts.items() if k != "llm_layer1"), verdicts

    vl = prep.loaded.reference
    fx, processed, ids = _case(prep, "one_window")
    ref = reference_generate(vl, ids, processed, TRACE_TOKENS, stop_at_eos=False)
    ctx = E2EContext(prep.loaded, ncnn_mods, torch_mods, bad, prep.policy)
    trace = trace_record("perturbed", vl.cfg, ids, processed, ref.tokens, ctx)
    assert not trace["passed"]
    assert trace["first_divergence"]["module"] == "llm_layer1"
    assert trace["first_divergence"]["call"] == 0
    by_module = {m["module"]: m for m in trace["modules"]}
    assert by_module["llm_layer1"]["local_max_abs"] > 10 * by_module["llm_layer0"]["local_max_abs"]
    assert by_module["llm_layer1"]["local_max_abs"] > 10 * by_module["llm_layer2"]["local_max_abs"]
    assert trace["worst_tensors"] and (bad.parent / "trace").is_dir()


# --- bench hooks ------------------------------------------------------------------------------
def test_bench_stages_and_calls(built, modules):
    from ncnnport.metrics import compare

    prep, _ = built
    ncnn_mods, _ = modules
    port, loaded = prep.port, prep.loaded
    assert port.bench_stages() == {"vision_encoder": ["224x224", "448x448"], "decode": ["16", "512"],
                                   "layers": ["16", "512"]}
    assert set(port.bench_perf_stages()) == {"layers", "decode", "vision_encoder"}
    for size, patches in (("224x224", 14 * 14), ("448x448", 28 * 28)):
        ours = port.bench_call(loaded, ncnn_mods, "vision_encoder", size)()
        ref = port.torch_bench_call(loaded, "vision_encoder", size)()
        assert ours[0].shape == ref[0].shape == (patches, loaded.reference.cfg.vision.hidden_size)
        for a, b in zip(ref, ours):
            s = compare(a, b)
            assert s.cosine > 0.999999 and s.max_abs < 1e-4 * s.ref_absmax, (size, s)
    vocab = loaded.reference.cfg.text.vocab_size
    for size in ("16", "512"):
        step = port.bench_call(loaded, ncnn_mods, "decode", size)
        a, b = step(), step()
        assert a[0].shape == (1, 1, vocab) and np.array_equal(a[0], b[0])
        torch_step = port.torch_bench_call(loaded, "decode", size)
        t1, t2 = torch_step(), torch_step()   # the cache is cropped back: same work, same answer
        assert t1[0].shape == (1, 1, vocab) and np.array_equal(t1[0], t2[0])
    hidden = loaded.reference.cfg.text.hidden_size
    layers_step, layers_torch = (port.bench_call(loaded, ncnn_mods, "layers", "16"),
                                 port.torch_bench_call(loaded, "layers", "16"))
    ours, ref = layers_step(), layers_torch()
    assert ours[0].shape == (1, 1, hidden) and np.array_equal(ours[0], layers_step()[0])
    # same random hidden state and a random (not the torch) cache: shapes and finiteness only
    assert ref[0].shape == (1, 1, hidden) and np.isfinite(ref[0]).all()
    head = (built[1] / "ncnn" / "lm_head.ncnn.bin").stat().st_size
    layers = sum((built[1] / "ncnn" / f"llm_layer{i}.ncnn.bin").stat().st_size
                 for i in range(loaded.reference.cfg.text.num_hidden_layers))
    nbytes = port.bench_bytes(loaded, "decode", "512")
    assert abs(nbytes["weights"] - (head + layers)) < 0.01 * (head + layers)   # what the graphs hold
    t = loaded.reference.cfg.text
    assert nbytes["kv_cache"] == 4 * 513 * (t.kv_lora_rank + t.qk_rope_head_dim) * t.num_hidden_layers
    assert port.bench_bytes(loaded, "layers", "512")["weights"] < nbytes["weights"] - 0.99 * head
    assert port.bench_bytes(loaded, "vision_encoder", "224x224") is None
    # bench --precision fp16-storage: the one-token stages step on the decode variants (fp16
    # InnerProduct weights; the prompt graphs' Gemm would keep fp32 weights and give 0 deviation)
    from ncnnport.runtime import precision
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    half_mods = open_ncnn_modules(built[1], options=precision.get("fp16-storage").options())
    half = port.bench_call(loaded, half_mods, "decode", "16")()[0]
    full = port.bench_call(loaded, ncnn_mods, "decode", "16")()[0]
    s = compare(full, half)
    assert 0 < s.max_abs < 1e-2 * s.ref_absmax and int(half.argmax()) == int(full.argmax())
    # every Gemm weight (all Linears but the absorbed kv_b_proj, and the head) at 2 bytes
    gemm = sum(int(line.split()[-1][2:]) for i in range(t.num_hidden_layers) for line in
               (built[1] / "ncnn" / f"llm_layer{i}.decode.ncnn.param").read_text().splitlines()
               if line.startswith("InnerProduct"))
    gemm += t.hidden_size * t.vocab_size
    assert nbytes["weights"] - port.bench_bytes(loaded, "decode", "512", "fp16-storage")["weights"] == 2 * gemm
    assert port.bench_bytes(loaded, "decode", "512", "fp16-weights") == nbytes   # widened to fp32 at load
    with pytest.raises(ValueError, match="no bench stage"):
        port.bench_call(loaded, ncnn_mods, "audio", "1")
    with pytest.raises(ValueError, match="HxW"):
        port.bench_call(loaded, ncnn_mods, "vision_encoder", "big")


def test_interleaved_vision_and_decode_are_bitwise_stable(built):
    """Vision encoder and decode steps alternate for 100 rounds on ncnn sessions; every output is
    bitwise identical to the same call made alone on freshly opened sessions."""
    from ncnnport.runtime.bench import fingerprint, interleave
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    port, loaded = prep.port, prep.loaded
    pairs = [("vision_encoder", "224x224"), ("decode", "16")]
    isolated = {}
    for stage, size in pairs:
        isolated[stage] = fingerprint(port.bench_call(loaded, open_ncnn_modules(pkg), stage, size)())
    mods = open_ncnn_modules(pkg)           # one session set shared by both stages
    last: dict[str, bytes] = {}
    mismatches: dict[str, int] = {s: 0 for s, _ in pairs}

    def checked(stage, fn):
        def call():
            out = fn()
            fp = fingerprint(out)
            mismatches[stage] += fp != isolated[stage]
            last[stage] = fp
            return out
        return call

    calls = {stage: checked(stage, port.bench_call(loaded, mods, stage, size)) for stage, size in pairs}
    results = interleave(calls, rounds=100, warmup=1)
    for stage, r in results.items():
        assert r.runs == 100 and r.identical_outputs, (stage, r.mismatched_calls[:5])
    assert mismatches == {"vision_encoder": 0, "decode": 0}
    assert last == isolated


def test_sub_model_sessions_share_no_mutable_state(built):
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    _, pkg = built
    mods = open_ncnn_modules(pkg)
    nets = [m.net for m in mods.values()]
    assert len({id(n) for n in nets}) == len(nets)
    before = {name: m.net.opt.num_threads for name, m in mods.items()}
    target = "vision_seg0"
    mods[target].net.opt.num_threads = before[target] + 3
    after = {name: m.net.opt.num_threads for name, m in mods.items()}
    assert after[target] == before[target] + 3
    assert {k: v for k, v in after.items() if k != target} == {k: v for k, v in before.items() if k != target}


# --- tied embedding ---------------------------------------------------------------------------
def test_tied_embedding_is_stored_once_and_read_from_the_lm_head(built, modules, tmp_path):
    import shutil

    from ncnnport.models.youtu_vl.tied_embed import TiedEmbedding, TiedEmbeddingError, read_head_table

    prep, pkg = built
    ncnn_mods, torch_mods = modules
    vl = prep.loaded.reference
    t = vl.cfg.text
    assert t.tie_word_embeddings and "text_embed" not in ncnn_mods
    assert not list((pkg / "ncnn").glob("text_embed.*"))
    head_bytes = (pkg / "ncnn" / "lm_head.ncnn.bin").stat().st_size
    total = sum(p.stat().st_size for p in (pkg / "ncnn").iterdir())
    assert total < 1.25 * head_bytes        # the [V,H] table is the bulk and is there once

    ours = TiedEmbedding.from_head(ncnn_mods["lm_head"])
    theirs = TiedEmbedding.from_head(torch_mods["lm_head"])
    assert isinstance(ours.table, np.memmap) and ours.table.shape == (t.vocab_size, t.hidden_size)
    ids = np.arange(t.vocab_size, dtype=np.int32)[None]
    expected = vl.embed(ids[0])[None]
    assert np.array_equal(ours.run([ids])[0], expected)      # a row gather: bitwise
    assert np.array_equal(theirs.run([ids])[0], expected)
    with pytest.raises(ValueError, match="out of range"):
        ours.run([np.array([[t.vocab_size]], np.int32)])

    bad = tmp_path / "lm_head.ncnn.bin"
    shutil.copyfile(pkg / "ncnn" / "lm_head.ncnn.bin", bad)
    with open(bad, "r+b") as f:
        f.truncate(head_bytes - 8)
    with pytest.raises(TiedEmbeddingError, match="expected"):
        read_head_table(pkg / "ncnn" / "lm_head.ncnn.param", bad)
    with pytest.raises(TiedEmbeddingError, match="Input, RMSNorm, Gemm"):
        read_head_table(pkg / "ncnn" / "llm_layer0.ncnn.param", pkg / "ncnn" / "llm_layer0.ncnn.bin")


def test_tied_rows_read_the_same_from_the_head_and_its_decode_variant(built, tmp_path):
    """The tied-embedding reader accepts the InnerProduct head (same .bin bytes) and refuses an
    InnerProduct whose weight size is not num_output x hidden."""
    from ncnnport.models.youtu_vl.tied_embed import TiedEmbeddingError, read_head_table

    _, pkg = built
    d = pkg / "ncnn"
    base = read_head_table(d / "lm_head.ncnn.param", d / "lm_head.ncnn.bin")
    variant = read_head_table(d / "lm_head.decode.ncnn.param", d / "lm_head.ncnn.bin")
    assert np.array_equal(np.asarray(base), np.asarray(variant))
    text = (d / "lm_head.decode.ncnn.param").read_text().splitlines()
    ip = next(i for i, line in enumerate(text) if line.startswith("InnerProduct"))
    n = int(next(t for t in text[ip].split() if t.startswith("0="))[2:])
    size = next(t for t in text[ip].split() if t.startswith("2="))
    text[ip] = text[ip].replace(size, f"2={n * base.shape[1] + 1}")
    bad = tmp_path / "lm_head.decode.ncnn.param"
    bad.write_text("\n".join(text) + "\n")
    with pytest.raises(TiedEmbeddingError, match="weight_data_size"):
        read_head_table(bad, d / "lm_head.ncnn.bin")
