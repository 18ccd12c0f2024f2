"""The SeedVR2 port end to end through the generic stages: export, convert (pnnx), local and
propagated parity, graph hygiene, the run verb with resident and streamed residency."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ncnnport.targets import Target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    from ncnnport.stages import convert_stage, prepare

    root = tmp_path_factory.mktemp("build")
    prep = prepare(Target("seedvr2", "tiny", None, root))
    return prep, convert_stage(prep)


@pytest.fixture(scope="session")
def summary(built):
    from ncnnport.parity.run import run_parity

    prep, pkg = built
    return run_parity(prep, pkg)


def test_every_local_and_e2e_gate_passes(summary) -> None:
    failed = [r for r in summary["modules"] + summary["e2e"] if not r["passed"]]
    assert not failed, failed[:3]
    assert summary["gates_passed"]
    cases: dict[str, set] = {}
    for r in summary["modules"]:
        cases.setdefault(r["name"], set()).add(r["case"])
    assert len(cases) == 17
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
    from ncnnport.convert.param_file import read_param

    _, pkg = built
    params = sorted((pkg / "ncnn").glob("*.ncnn.param"))
    assert len(params) == 17
    for p in params:
        g = read_param(p)
        for layer in g.layers:
            assert "." not in layer.type, (p.name, layer.type)
            if layer.type == "Concat":
                assert layer.get("0") != "-233", (p.name, layer.name)
            if layer.type in ("Slice", "Crop"):
                assert layer.get("1") != "-233", (p.name, layer.name)
    types = {l.type for p in params for l in read_param(p).layers}
    assert {"Convolution3D", "SDPA", "RMSNorm", "Gemm"} <= types


def test_run_verb_image_and_frames_folder(built, tmp_path) -> None:
    """run: image -> PNG, folder of frames -> frames; streamed and resident byte-identical."""
    import argparse

    from ncnnport.stages import open_ncnn_modules

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


def test_e2e_accepts_user_images_and_frame_folders(built, tmp_path, monkeypatch) -> None:
    from ncnnport.models.seedvr2 import port as portmod
    from ncnnport.parity.policy import Policy
    from ncnnport.registry import E2EContext
    from ncnnport.stages import open_ncnn_modules

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
