"""The SeedVR2 port end to end through the generic stages: export, convert (pnnx), local and
propagated parity, graph hygiene, the run verb with resident and streamed residency."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ncnnport.targets import Target

pytestmark = pytest.mark.slow

# the tiny preset's general VAE graphs (runner.vae_graph_names): clips run them, images their twins
GENERAL_VAE = ("vae_encode", "vae_decode_0", "vae_decode_1", "vae_decode_2", "vae_decode_3")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    from ncnnport.stages import convert_stage, prepare

    root = tmp_path_factory.mktemp("build")
    prep = prepare(Target("seedvr2", "tiny", None, root))
    return prep, convert_stage(prep)


@pytest.fixture(scope="session")
def summary(built):
    from ncnnport.drivers.parity import run_parity

    prep, pkg = built
    return run_parity(prep, pkg)


def test_every_local_and_e2e_gate_passes(summary) -> None:
    failed = [r for r in summary["modules"] + summary["e2e"] if not r["passed"]]
    assert not failed, failed[:3]
    assert summary["gates_passed"]
    cases: dict[str, set] = {}
    for r in summary["modules"]:
        cases.setdefault(r["name"], set()).add(r["case"])
    # 17 graphs + the single-frame twins of the 5 VAE graphs (runner.image_graph), each judged locally
    assert len(cases) == 22
    assert {n for n in cases if n.startswith("vae_")} == {g + suffix for g in GENERAL_VAE for suffix in ("", "_image")}
    for name, c in cases.items():
        if name != "dit_embedding":          # the only graph without a dynamic axis
            assert len(c) >= 3, (name, c)    # both trace sizes + at least one untraced size


def test_e2e_covers_resolutions_windows_and_video(summary) -> None:
    e2e = summary["e2e"]
    fixtures = {r["fixture"] for r in e2e}
    assert {"image_64x96", "image_256x448_multiwindow", "image_336x336_edge_windows", "video_9x64x96"} <= fixtures
    stages = {(r["fixture"], r["stage"]): r for r in e2e}
    for fx in fixtures:
        for st in ("latent", "block_00", "block_01", "block_02", "block_03", "vid_out", "decoded", "frames"):
            assert (fx, st) in stages, (fx, st)
        rec = stages[(fx, "frames")]
        assert rec["image_max_abs"] <= 1 and rec["psnr_db"] > 60, rec
        for st in ("latent", "block_03", "vid_out"):
            assert stages[(fx, st)]["max_abs"] <= 1e-4 * stages[(fx, st)]["ref_absmax"]
    assert stages[("video_9x64x96", "frames")]["frames_in"] == 9
    assert stages[("video_9x64x96", "latent")]["latent_shape"][1] == 3
    sizes = {tuple(stages[(fx, "frames")]["size"]) for fx in fixtures}
    assert any(h != w for h, w in sizes) and len(sizes) >= 3
    res = stages[("image_256x448_multiwindow", "residency")]
    assert res["byte_identical"] and res["max_abs"] == 0 and res["block_loads"] == 8

    from ncnnport.models.seedvr2.windows import partition
    assert len(partition((1, 16, 28), False)) == 4 and len(partition((1, 16, 28), True)) == 4


def test_converted_graphs_are_stock_and_batch_axis_safe(built) -> None:
    from ncnnport.package.param_file import read_param

    _, pkg = built
    params = sorted((pkg / "ncnn").glob("*.ncnn.param"))
    assert len(params) == 22
    for p in params:
        g = read_param(p)
        for layer in g.layers:
            assert "." not in layer.type, (p.name, layer.type)
            if layer.type == "Concat":
                assert layer.get("0") != "-233", (p.name, layer.name)
            if layer.type in ("Slice", "Crop"):
                assert layer.get("1") != "-233", (p.name, layer.name)
    types = {l.type for p in params for l in read_param(p).layers}
    assert {"Convolution", "SDPA", "RMSNorm", "Gemm"} <= types
    assert "Convolution3D" not in types  # the VAE's 3-D convs are folded into 2-D ones (conv_fold)
    # each graph stores its weights once (shared-weight blocks: one Gemm per weight, not per stream)
    prep, _ = built
    sizes = prep.port.module_weight_bytes(prep.loaded)
    for name, nbytes in sizes.items():
        stored = (pkg / "ncnn" / f"{name}.ncnn.bin").stat().st_size
        if name.endswith("_image"):
            # a twin declares its general graph's weights but stores each causal conv's taps
            # summed: a 3x3x3 kernel becomes 3x3, so well under half (the 1x1x1 convs stay)
            general = (pkg / "ncnn" / f"{name[:-len('_image')]}.ncnn.bin").stat().st_size
            assert 0.25 * general <= stored <= 0.5 * general, (name, stored, general)
            continue
        assert nbytes <= stored <= nbytes + 4096 * 64, (name, nbytes, stored)


def test_run_verb_image_and_frames_folder(built, tmp_path) -> None:
    """run: image -> PNG, folder of frames -> frames; streamed and resident byte-identical."""
    import argparse

    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    modules = open_ncnn_modules(pkg)
    rng = np.random.default_rng(0)
    img = tmp_path / "in.png"
    Image.fromarray(rng.integers(0, 256, (70, 100, 3), dtype=np.uint8)).save(img)
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    p = argparse.ArgumentParser()
    prep.port.add_run_arguments(p)
    outs = {}
    for residency in ("resident", "streamed"):
        out = tmp_path / f"out_{residency}.png"
        args = p.parse_args(["--input", str(img), "--output", str(out), "--residency", residency])
        assert prep.port.run(prep.loaded, modules, args) == 0
        outs[residency] = np.asarray(Image.open(out))
    assert outs["resident"].shape == (64, 96, 3)           # centre crop to a multiple of 16
    assert np.array_equal(outs["resident"], outs["streamed"])
    args = p.parse_args(["--input", str(folder), "--output", str(tmp_path / "out_frames")])
    assert prep.port.run(prep.loaded, modules, args) == 0
    written = sorted((tmp_path / "out_frames").glob("*.png"))
    assert len(written) == 6 and np.asarray(Image.open(written[0])).shape == (48, 64, 3)


def test_run_verb_tiles_the_vae_when_asked(built, tmp_path, capsys) -> None:
    """--vae-tile runs the pipeline's VAE on tiles (a 96x128 frame at 64 px tiles: 2 x 3 of
    them): the written frame is the tiled pipeline's, and the run says it is tiled."""
    import argparse

    from ncnnport.models.seedvr2.host import latent_shape_for
    from ncnnport.models.seedvr2.pipeline import Noise, restore
    from ncnnport.models.seedvr2.port import graph_backend_for
    from ncnnport.models.seedvr2.tiles import TiledVAE, TileSpec
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    modules = open_ncnn_modules(pkg)
    img = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(img)
    p = argparse.ArgumentParser()
    prep.port.add_run_arguments(p)
    out = {}
    for name, extra in (("untiled", []), ("tiled", ["--vae-tile", "64", "--vae-overlap", "16"])):
        args = p.parse_args(["--input", str(img), "--output", str(tmp_path / f"{name}.png"), "--posterior", "mean",
                             *extra])
        assert prep.port.run(prep.loaded, modules, args) == 0
        out[name] = np.asarray(Image.open(tmp_path / f"{name}.png"))
    assert "VAE tiled 64 px, overlap 16 px" in capsys.readouterr().err
    cfg, ref = prep.loaded.reference.config, prep.loaded.reference
    backend = TiledVAE(graph_backend_for(cfg, modules)[0], TileSpec(64, 16), cfg.vae.spatial_factor)
    video = np.asarray(Image.open(img))[None]
    area = 96 * 128
    noise = Noise.seeded(latent_shape_for(cfg, video, area), 666, sample_posterior=False)
    expected = restore(cfg, backend, video, ref.text.numpy(), noise, area=area).frames[0]
    assert np.array_equal(out["tiled"], expected)
    assert not np.array_equal(out["tiled"], out["untiled"])


def test_e2e_records_tiled_vs_untiled_and_ncnn_vs_torch_tiled(summary) -> None:
    rec = {r["stage"]: r for r in summary["e2e"] if r["stage"].startswith(("tiling:", "tiled:"))}
    assert set(rec) == {"tiling:decode", "tiling:encode", "tiling:frames", "tiled:latent", "tiled:decoded",
                        "tiled:frames"}
    assert all(r["passed"] for r in rec.values()), rec
    assert rec["tiling:frames"]["gated"] is False
    assert rec["tiling:decode"]["cosine"] < 0.99999          # tiling changes numbers: it is measured, not assumed
    assert rec["tiled:decoded"]["max_abs"] <= 1e-4 * rec["tiled:decoded"]["ref_absmax"]


def test_e2e_accepts_user_images_and_frame_folders(built, tmp_path, monkeypatch) -> None:
    from ncnnport.models.seedvr2 import port as portmod
    from ncnnport.parity.policy import Policy
    from ncnnport.registry import E2EContext
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    monkeypatch.setattr(portmod, "FIXTURES", ())       # only the user inputs
    rng = np.random.default_rng(1)
    folder = tmp_path / "clip"
    folder.mkdir()
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(folder / f"f{i}.png")
    img = tmp_path / "photo.png"
    Image.fromarray(rng.integers(0, 256, (50, 40, 3), dtype=np.uint8)).save(img)
    ctx = E2EContext(loaded=prep.loaded, ncnn_modules=open_ncnn_modules(pkg), torch_modules={},
                     package_dir=pkg, policy=Policy.load(prep.port.policy_path), user_inputs=[folder, img])
    recs = prep.port.e2e_parity(ctx)
    assert {r["fixture"] for r in recs} == {"input:clip", "input:photo.png"}
    assert all(r["passed"] for r in recs), [r for r in recs if not r["passed"]][:2]
    frames = {r["fixture"]: r for r in recs if r["stage"] == "frames"}
    assert frames["input:clip"]["frames_in"] == 5 and frames["input:clip"]["latent_shape"][1] == 2
    assert frames["input:photo.png"]["size"] == [48, 32]


# --- lazy modules, streamed residency, --precision ----------------------------------------------
def _run_args(prep, *argv):
    import argparse

    p = argparse.ArgumentParser()
    prep.port.add_run_arguments(p)
    return p.parse_args([str(a) for a in argv])


def test_lazy_modules_open_on_access_and_check_the_manifest(built, tmp_path) -> None:
    import shutil

    from ncnnport.runtime.lazy_modules import LazyModules

    _, pkg = built
    mods = LazyModules(pkg)
    assert len(mods) == 22 and "dit_block_00_pre" in mods and "nope" not in mods
    assert mods.live == [] and mods.opens == 0           # len / in / iteration open nothing
    m = mods["dit_block_00_pre"]
    assert mods["dit_block_00_pre"] is m and mods.opens == 1
    mods.release("dit_block_00_pre")
    assert mods.live == [] and mods["dit_block_00_pre"] is not m and mods.opens == 2
    with pytest.raises(KeyError):
        mods["nope"]
    bad = tmp_path / "pkg"
    shutil.copytree(pkg, bad)
    with open(bad / "ncnn" / "dit_block_01_post.ncnn.bin", "r+b") as f:
        f.seek(64)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(RuntimeError, match="does not match its manifest"):
        LazyModules(bad)


def test_streamed_run_is_byte_identical_and_holds_one_block_graph(built, tmp_path) -> None:
    """The run verb on the runner lifecycle (what `ncnnport run` hands every port):
    resident ends up holding all 8 block graphs, streamed never more than one."""
    from ncnnport.models.seedvr2.port import is_block_graph
    from ncnnport.runtime.lazy_modules import LazyModules

    prep, pkg = built
    img = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (128, 160, 3), dtype=np.uint8)).save(img)
    outs, peaks = {}, {}
    for residency in ("resident", "streamed"):
        mods = LazyModules(pkg)
        out = tmp_path / f"{residency}.png"
        assert prep.port.run(prep.loaded, mods, _run_args(prep, "--input", img, "--output", out,
                                                          "--residency", residency)) == 0
        outs[residency] = np.asarray(Image.open(out))
        peaks[residency] = mods.live_peak(is_block_graph)
        opened = [n for k, n in mods.events if k == "open"]
        assert {n for n in opened if is_block_graph(n)} == {f"dit_block_{i:02d}_{p}" for i in range(4)
                                                             for p in ("pre", "post")}
    assert np.array_equal(outs["resident"], outs["streamed"])
    assert peaks == {"resident": 8, "streamed": 1}


def test_low_memory_run_closes_each_stage_before_the_next(built, tmp_path) -> None:
    """``run --low-memory``: the encoder's graph is closed before the DiT opens, the DiT's before
    the decoder opens, and nothing is left open at the end, so the decode's peak holds the
    decoder's weights alone (at 720p the three stages held at once were 9.6 GB). Frames are
    byte-identical to the default run, which keeps every graph open."""
    from ncnnport.runtime.lazy_modules import LazyModules
    from ncnnport.runtime.options import RuntimeOptions

    prep, pkg = built
    img = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(img)
    frames, runs = {}, {}
    for low in (False, True):
        mods = LazyModules(pkg, options=RuntimeOptions(low_memory=low))
        out = tmp_path / f"low{int(low)}.png"
        assert prep.port.run(prep.loaded, mods, _run_args(prep, "--input", img, "--output", out)) == 0
        frames[low], runs[low] = np.asarray(Image.open(out)), mods
    assert np.array_equal(frames[False], frames[True])
    # default: every graph the image runs stays open (the VAE's single-frame twins, not the general graphs)
    assert set(runs[False].live) == set(runs[False]) - set(GENERAL_VAE)
    low = runs[True]
    assert low.live == []
    live: set[str] = set()
    for kind, name in low.events:
        (live.add if kind == "open" else live.discard)(name)
        if kind == "open" and name.startswith("dit_"):
            assert "vae_encode" not in live, low.events
        if kind == "open" and name.startswith("vae_decode"):
            assert not any(n.startswith(("dit_", "vae_encode")) for n in live), low.events


def test_cli_run_hands_the_port_a_lazy_mapping(built, tmp_path, monkeypatch) -> None:
    from ncnnport import cli
    from ncnnport.models.seedvr2.port import PORT
    from ncnnport.runtime.lazy_modules import LazyModules

    prep, pkg = built
    seen = {}

    def fake_run(loaded, modules, args):
        seen["modules"], seen["args"] = modules, args
        return 0

    monkeypatch.setattr(PORT, "run", fake_run)
    build_dir = pkg.parent.parent.parent   # <root>/seedvr2/tiny/package
    img = tmp_path / "x.png"               # the CLI validates the input before any model loads
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(img)
    rc = cli.main(["run", "seedvr2", "--build-dir", str(build_dir), "--threads", "1",
                   "--input", str(img), "--output", str(tmp_path / "y.png"), "--precision", "bf16"])
    assert rc == 0
    assert isinstance(seen["modules"], LazyModules) and seen["modules"].live == []
    assert seen["modules"].options.bf16_storage and not seen["modules"].options.fp16_storage


def test_precision_flag_runs_reduced_storage_within_its_frame_budget(built, tmp_path) -> None:
    """The generic ``--precision`` (runtime.precision) opens the graphs with its ncnn options;
    the port runs what it is handed, and each setting stays within its own mode's frame gate."""
    from ncnnport.models.seedvr2.frames import image_rows
    from ncnnport.models.seedvr2.port import PORT
    from ncnnport.metrics import compare, judge
    from ncnnport.runtime import precision
    from ncnnport.runtime.lazy_modules import LazyModules

    prep, pkg = built
    img = tmp_path / "in.png"
    Image.fromarray(np.random.default_rng(4).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(img)
    outs = {}
    for name in ("fp32", "fp16-packed", "bf16"):
        mods = LazyModules(pkg, options=precision.get(name).options())
        out = tmp_path / f"{name}.png"
        assert PORT.run(prep.loaded, mods, _run_args(prep, "--input", img, "--output", out)) == 0
        assert mods["dit_input"].options == precision.get(name).options()
        outs[name] = np.asarray(Image.open(out))[None]
    assert not np.array_equal(outs["fp32"], outs["bf16"])   # the setting reached the graphs
    for name in ("fp16-packed", "bf16"):
        ok, reason = judge(compare(image_rows(outs["fp32"]), image_rows(outs[name])),
                           prep.policy.stage("frames", precision.get(name).mode))
        assert ok, (name, reason)


def test_e2e_records_frame_metrics_per_reduced_precision_option(summary) -> None:
    from ncnnport.parity.sweep import variants

    recs = {r["stage"]: r for r in summary["e2e"] if r["stage"].startswith("precision:")}
    from ncnnport.runtime import precision

    runtime_variants = {f"precision:{v.name}" for v in variants(False)  # on the fp32 package itself
                        if v.precision != "fp32" and precision.get(v.setting).package_name == "package"}
    assert runtime_variants <= set(recs)
    for r in recs.values():
        assert r["passed"], r
        for k in ("image_mae", "psnr_db", "image_max_abs", "differing_bytes"):
            assert k in r and k in r["vs_ncnn_fp32"], (r["stage"], k)
    assert recs["precision:bf16"]["differing_bytes"] > 0


# --- first divergence -----------------------------------------------------------------------------
def test_e2e_records_the_noise_and_the_official_as_shipped_distance(summary) -> None:
    """Every fixture's e2e rows carry the noise they used (seeded official draws, posterior
    sampled) and one reported, ungated "ncnn fp32 vs official-as-shipped" frames row."""
    e2e = [r for r in summary["e2e"] if r.get("kind") == "tensor"]
    official = {r["fixture"]: r for r in e2e if r["stage"] == "frames:official_as_shipped"}
    assert set(official) == {r["fixture"] for r in e2e if r["stage"] == "frames"}
    for fx, rec in official.items():
        assert rec["gated"] is False and rec["passed"] is True and rec["compares"] == "ncnn fp32 vs official-as-shipped"
        assert rec["psnr_db"] > 30 and rec["image_max_abs"] > 0, rec        # bf16 numerics differ, a little
        noise = next(r["noise"] for r in e2e if r["fixture"] == fx and r["stage"] == "latent")
        assert noise["posterior"] == "sample" and noise["dtype"] == "bfloat16" and len(noise["sha256"]) == 64


def test_trace_record_passes_and_covers_every_graph(summary) -> None:
    traces = [r for r in summary["e2e"] if r.get("kind") == "trace"]
    assert len(traces) == 1 and traces[0]["fixture"] == "image_64x96"
    t = traces[0]
    assert t["passed"] and t["first_divergence"] is None, t["reason"]
    # an image runs the VAE's single-frame twins: every graph but the general VAE graphs (which the
    # video fixture runs) is in the image's trace
    assert {m["module"] for m in t["modules"]} == {r["name"] for r in summary["modules"]} - set(GENERAL_VAE)
    order = [m["module"] for m in t["modules"]]
    assert order.index("vae_encode_image") < order.index("dit_block_00_pre") < order.index("dit_block_03_post") \
        < order.index("vae_decode_0_image")


def test_perturbed_block_weights_are_named_as_first_divergence(built, tmp_path) -> None:
    """A test double: DiT block 1's two ncnn weight files scaled by 1.001. The trace must name
    block 1 (its pre graph is its first call) and see that block's own local error jump."""

    from ncnnport.models.seedvr2.port import FIXTURES, PORT, TRACE_FIXTURE
    from ncnnport.registry import E2EContext
    from ncnnport.stages import torch_modules
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    from tests.perturb import perturbed_package

    bad = perturbed_package(pkg, tmp_path / "pkg", ["dit_block_01_pre", "dit_block_01_post"])
    ctx = E2EContext(prep.loaded, open_ncnn_modules(bad), torch_modules(prep), bad, prep.policy)
    fx = next(f for f in FIXTURES if f.label == TRACE_FIXTURE)
    video = fx.video()
    trace = PORT._trace("perturbed", video, fx.seed, PORT._area(prep.loaded, *video.shape[1:3]), ctx)
    assert not trace["passed"]
    assert trace["first_divergence"]["module"] == "dit_block_01_pre", trace["first_divergence"]
    by_module = {m["module"]: m for m in trace["modules"]}
    assert by_module["dit_block_01_pre"]["local_max_abs"] > 10 * by_module["dit_block_00_pre"]["local_max_abs"]
    assert trace["worst_tensors"] and (tmp_path / "trace").is_dir()


# --- bench --------------------------------------------------------------------------------------
def test_bench_has_block_and_vae_stages_at_two_sizes_matching_torch(built) -> None:
    from ncnnport.runtime.lazy_modules import open_ncnn_modules

    prep, pkg = built
    port = prep.port
    stages = port.bench_stages()
    for st in ("dit_block", "vae_encode", "vae_decode"):
        assert stages[st] == ["256x256", "512x512"], st
    modules = open_ncnn_modules(pkg)
    for st in ("dit_block", "vae_decode"):
        ncall = port.bench_call(prep.loaded, modules, st, "256x256")
        tcall = port.torch_bench_call(prep.loaded, st, "256x256")
        a, b = ncall(), ncall()
        assert all(np.array_equal(x, y) for x, y in zip(a, b))     # fixed inputs: same bytes
        ref = tcall()
        for r, c in zip(ref, a):
            r = np.asarray(r).reshape(c.shape)
            assert np.abs(r - c).max() <= 1e-4 * np.abs(r).max(), st


# --- streamed full-depth parity ------------------------------------------------------------------
def test_streamed_parity_matches_the_in_memory_run(built, summary) -> None:
    """``parity --stream``: one module of each side at a time gives the same propagated numbers as
    the in-memory e2e run (same reference ops, same graphs), plus per-block local rows."""
    from ncnnport.parity.policy import Policy
    from ncnnport.registry import E2EContext
    from ncnnport.runtime.lazy_modules import LazyModules

    prep, pkg = built
    modules = LazyModules(pkg)
    ctx = E2EContext(loaded=prep.loaded, ncnn_modules=modules, torch_modules={}, package_dir=pkg,
                     policy=Policy.load(prep.port.policy_path))
    recs, receipt = prep.port.streamed_parity(ctx)
    assert all(r["passed"] for r in recs), [r for r in recs if not r["passed"]][:2]
    assert modules.live_peak(lambda n: True) <= 4 and modules.live == []   # a block pair + attention (+ I/O)
    streamed = {r["stage"]: r for r in recs}
    in_memory = {r["stage"]: r for r in summary["e2e"] if r["fixture"] == "image_64x96"}
    for stage in ("latent", "block_00", "block_03", "vid_out", "decoded", "frames"):
        assert streamed[stage]["max_abs"] == pytest.approx(in_memory[stage]["max_abs"], rel=1e-3, abs=1e-7), stage
    assert {f"block_{i:02d}/local" for i in range(4)} <= set(streamed)
    phases = receipt["image_64x96"]["phases"]
    assert "block_03_torch" in phases and receipt["image_64x96"]["peak_rss_mb"] > 0
