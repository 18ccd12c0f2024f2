"""SeedVR2 packages: model.json, the text embedding, the host tables and the e2e cases' expected
frames written from the torch reference; ``verify`` and ``run --package`` run them with torch
and transformers blocked, giving the torch run path's frame bytes on the same noise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ncnnport.targets import Target
from tests.torchfree import blocking_env, cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from ncnnport.stages import convert_stage, prepare

    prep = prepare(Target("seedvr2", "tiny", None, tmp_path_factory.mktemp("seedvr2_pkg")))
    return prep, convert_stage(prep)


def test_model_json_and_text_embedding_describe_the_reference(built):
    from ncnnport.models.seedvr2.config import SeedVR2Config

    prep, pkg = built
    doc = json.loads((pkg / "model.json").read_text())
    ref = prep.loaded.reference
    assert SeedVR2Config.from_json(doc["config"], source="model.json") == ref.config
    text = np.load(pkg / doc["files"]["text_embedding"], allow_pickle=False)
    assert np.array_equal(text, ref.text.numpy())
    assert doc["latent"]["scaling_factor"] == ref.config.vae.scaling_factor and doc["noise"]["seed"] == 666


def test_case_expectations_reproduce_from_the_packaged_input(built):
    """The expected frames are the torch reference's on the case's own PNG, at its seed and area."""
    from ncnnport.models.seedvr2.describe import frame_summary
    from ncnnport.models.seedvr2.pipeline import TorchBackend, restore
    from ncnnport.models.seedvr2.port import read_frames
    from ncnnport.package.cases import read_cases

    prep, pkg = built
    ref = prep.loaded.reference
    cases = read_cases(pkg)
    assert len(cases) >= 2
    case = cases[0]
    video = read_frames(case.inputs["frames"])
    result = restore(ref.config, TorchBackend(ref.dit, ref.vae), video, ref.text.numpy(),
                     seed=case.args["seed"], area=case.args["area"])
    assert frame_summary(result.frames)["frames_sha256"] == case.expected["frames_sha256"]


def test_case_noise_is_stored_and_reproduces_the_expected_frames(built):
    """Each case carries its x_T and posterior noise as float32 npz (hashed in the manifest): fed
    back explicitly, they give the expected frames, so a runtime without torch's generator can."""
    from ncnnport.models.seedvr2.describe import frame_summary
    from ncnnport.models.seedvr2.pipeline import Noise, TorchBackend, restore
    from ncnnport.models.seedvr2.port import read_frames
    from ncnnport.package.cases import read_cases

    prep, pkg = built
    ref = prep.loaded.reference
    manifest = json.loads((pkg / "manifest.json").read_text())["files"]
    for case in read_cases(pkg):
        assert f"cases/{case.name}/noise.npz" in manifest
        with np.load(case.inputs["noise"], allow_pickle=False) as z:
            assert sorted(z.files) == ["posterior", "x_T"] and all(z[k].dtype == np.float32 for k in z.files)
            noise = Noise(x_T=z["x_T"], posterior=z["posterior"])
        seeded = Noise.seeded(noise.x_T.shape, case.args["seed"])
        assert np.array_equal(noise.x_T, seeded.x_T) and np.array_equal(noise.posterior, seeded.posterior)
        result = restore(ref.config, TorchBackend(ref.dit, ref.vae), read_frames(case.inputs["frames"]),
                         ref.text.numpy(), noise, area=case.args["area"])
        assert frame_summary(result.frames)["frames_sha256"] == case.expected["frames_sha256"]


def test_verify_without_torch_passes_goldens_and_every_case(built, tmp_path):
    """Cases run torch-free on their stored noise and are judged against the torch reference's
    frames (``expected.png``) by the packaged fp32 frames gate: ncnn's graphs are not torch's
    bit for bit, so a few values land one level off (the parity run's frames record)."""
    _, pkg = built
    r = cli("verify", pkg, env=blocking_env(tmp_path / "block"))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ")][2:]
    assert not [ln for ln in rows if "| FAIL |" in ln]
    cases = [ln for ln in rows if ln.startswith("| case |")]
    assert len(cases) >= 2 and all("bytes equal" in ln or "frames gate: pass" in ln for ln in cases), cases
    print("\n".join(cases))
    assert sum("| golden |" in ln and "| PASS |" in ln for ln in rows) >= 17


def _run_both(built, tmp_path, *extra: object, case: str = "image_256x448_multiwindow") -> tuple[bytes, bytes, str, str]:
    """``run`` on the model build (torch host ops) and ``run --package`` with torch and
    transformers blocked, same input and noise: (frames a, frames b, stdout a, stdout b)."""
    from PIL import Image

    prep, pkg = built
    case = pkg / "cases" / case
    args = ["run", "seedvr2", "--input", case / "input.png", *extra]
    a = cli(*args, "--output", tmp_path / "a.png", "--build-dir", prep.target.build_root)
    b = cli(*args, "--output", tmp_path / "b.png", "--package", pkg, env=blocking_env(tmp_path / "block"))
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    fa, fb = (np.asarray(Image.open(tmp_path / f"{k}.png")) for k in "ab")
    return fa, fb, a.stdout.replace(str(tmp_path / "a.png"), "OUT"), b.stdout.replace(str(tmp_path / "b.png"), "OUT")


def test_run_package_without_torch_gives_the_run_paths_bytes_on_the_case_noise(built, tmp_path):
    """No resize (the case runs at its own area): every host step is bit-exact, so the frames
    are the ncnn run path's bytes (and within the frames gate of the torch reference's)."""
    from ncnnport.models.seedvr2.packaged import judge_frames
    from ncnnport.models.seedvr2.port import read_frames
    from ncnnport.package.cases import read_cases
    from ncnnport.parity.policy import Policy

    _, pkg = built
    case = next(c for c in read_cases(pkg) if c.name == "image_256x448_multiwindow")
    fa, fb, out_a, out_b = _run_both(built, tmp_path, "--noise", case.inputs["noise"])
    assert np.array_equal(fa, fb) and out_a == out_b
    ok, detail = judge_frames(fb[None], read_frames(case.inputs["expected"]),
                              Policy.load(pkg / "policy.json").stage("frames", "fp32"))
    print(f"run --package vs the torch reference: {detail}")
    assert ok, detail


@pytest.mark.parametrize("case, area, latent", [("image_64x96", 128 * 192, (16, 1, 16, 24)),
                                                 ("image_256x448_multiwindow", 128 * 224, (16, 1, 16, 28))])
def test_run_package_with_a_resize_equals_the_run_path_or_its_frames_gate(built, tmp_path, case, area, latent):
    """An upscale (96x64 -> 192x128): the numpy resize is ATen's bytes, so the frames are the
    run path's. A downscale (448x256 -> 224x128): within 2 float32 ulp of ATen's, not bit-exact,
    so the packaged fp32 frames gate judges (the measured difference is printed)."""
    from ncnnport.models.seedvr2.host import numpy_noise
    from ncnnport.models.seedvr2.packaged import judge_frames
    from ncnnport.parity.policy import Policy

    _, pkg = built
    noise = tmp_path / "noise.npz"
    n = numpy_noise(latent, 5)
    np.savez(noise, x_T=n.x_T, posterior=n.posterior)
    fa, fb, out_a, out_b = _run_both(built, tmp_path, "--area", area, "--noise", noise, case=case)
    assert fa.shape == (latent[2] * 8, latent[3] * 8, 3) and out_a == out_b
    ok, detail = judge_frames(fb[None], fa[None], Policy.load(pkg / "policy.json").stage("frames", "fp32"))
    print(f"{case} resized to area {area}: torch-free vs torch run path: {detail}")
    if case == "image_64x96":
        assert np.array_equal(fa, fb), detail
    assert ok, detail


def test_run_package_without_noise_draws_with_numpy_and_says_so(built, tmp_path):
    _, pkg = built
    r = cli("run", "seedvr2", "--input", pkg / "cases" / "image_64x96" / "input.png", "--output", tmp_path / "o.png",
            "--package", pkg, env=blocking_env(tmp_path / "block"))
    assert r.returncode == 0, r.stderr
    assert "not the official torch stream" in r.stderr and "noise seed 666 on numpy" in r.stdout
    assert (tmp_path / "o.png").is_file()


def test_run_package_refuses_cuda_noise_in_one_line(built, tmp_path):
    _, pkg = built
    r = cli("run", "seedvr2", "--input", pkg / "cases" / "image_64x96" / "input.png", "--output", tmp_path / "o.png",
            "--package", pkg, "--noise-device", "cuda", env=blocking_env(tmp_path / "block"))
    assert r.returncode == 2 and "run --package has no torch" in r.stderr and "Traceback" not in r.stderr
