"""ncnnport-seedvr2 (runtime/cpp/apps/seedvr2) against the Python ncnn loop on the same package.

The Python loop here is ``pipeline.restore`` with ``runner.GraphBackend`` over the package's own
graphs (``NcnnModule``), fed the packaged case's ``noise.npz``: the same graphs, the same noise,
the same area. What is compared, and why not everything byte for byte:

* the preprocessed input (resize, crop, [-1, 1]) must be bit-identical;
* the C++ executable links the pinned ncnn built from its sdist by Debian's GCC 12, the Python
  loop the PyPI wheel (GCC 14); ncnn compiles itself with ``-Ofast -ffast-math``, so the two
  libraries are not bitwise twins (vae_encode on bit-identical input already differs in the last
  bits). The C++ host also evaluates sin/cos/exp correctly rounded where torch (SLEEF) and
  numpy (SIMD expf) are within an ulp. Graph stages are therefore judged by the package policy's
  fp32 gate and the frames by its ``frames`` gate (uint8 levels), and the differing-byte count is
  printed with the test output;
* perturbing the C++ loop (swapped window shift, h/w RoPE axes exchanged) must fail those gates.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("NCNNPORT_SEEDVR2_EXE", ROOT / "build" / "cpp" / "ncnnport-seedvr2"))
GRAPH_STAGES = ("posterior_mean", "latent", "velocity", "decoded")


@pytest.fixture(scope="session")
def seedvr2_exe(built_cpp) -> Path:
    return built_cpp(EXE, "NCNNPORT_SEEDVR2_EXE")


@pytest.fixture(scope="session")
def package(tmp_path_factory) -> Path:
    """The tiny SeedVR2 package, converted once per session (with its packaged e2e cases);
    NCNNPORT_SEEDVR2_PACKAGE names an already converted one instead."""
    if "NCNNPORT_SEEDVR2_PACKAGE" in os.environ:
        return Path(os.environ["NCNNPORT_SEEDVR2_PACKAGE"])
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    root = tmp_path_factory.mktemp("seedvr2")
    return Path(convert_stage(prepare(Target("seedvr2", "tiny", None, root))))


GRAPH_SECONDS = ("vae_encode", "dit", "vae_decode")


def run_cpp(exe: Path, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=600, check=False)


def case_dirs(package: Path) -> list[Path]:
    cases = sorted(p.parent for p in (package / "cases").glob("*/case.json"))
    assert cases, f"{package} has no packaged cases"
    return cases


def cpp_restore(exe: Path, package: Path, case: Path, out: Path, *extra: str) -> dict[str, Any]:
    """Runs the executable on a packaged case; returns its JSON, frames and dumped stages."""
    area = json.loads((case / "case.json").read_text())["args"]["area"]
    res = run_cpp(exe, "--package", package, "--input", case / "input.png", "--output", out / "frames",
                  "--noise", case / "noise.npz", "--area", str(area), "--json-out", out / "run.json",
                  "--dump-stages", out / "stages", *extra)
    assert res.returncode == 0, res.stderr
    from PIL import Image

    doc = json.loads((out / "run.json").read_text())
    frames = np.stack([np.asarray(Image.open(f["path"])) for f in doc["frames"]])
    stages = {p.stem: np.load(p, allow_pickle=False) for p in (out / "stages").glob("*.npy")}
    return {"json": doc, "frames": frames, "stages": stages}


def python_restore(package: Path, case: Path) -> Any:
    """The Python ncnn loop on a packaged case: its image, noise and area."""
    from PIL import Image

    video = np.asarray(Image.open(case / "input.png").convert("RGB"))[None]
    area = json.loads((case / "case.json").read_text())["args"]["area"]
    return python_loop(package, video, case / "noise.npz", area)


def python_loop(package: Path, video: np.ndarray, noise_npz: Path, area: int) -> Any:
    """The Python ncnn loop over the package's graphs with explicit noise (no torch model)."""
    from ncnnport.models.seedvr2.config import SeedVR2Config
    from ncnnport.models.seedvr2.pipeline import Noise, restore
    from ncnnport.models.seedvr2.runner import GraphBackend
    from ncnnport.runtime.session import NcnnModule

    model = json.loads((package / "model.json").read_text())
    cfg = SeedVR2Config.from_json(model["config"], "model.json")

    def get(name: str) -> NcnnModule:
        spec = json.loads((package / "specs" / f"{name}.spec.json").read_text())
        return NcnnModule(package / "ncnn" / f"{name}.ncnn.param", package / "ncnn" / f"{name}.ncnn.bin", spec)

    graphs: dict[str, NcnnModule] = {}
    text = np.load(package / model["files"]["text_embedding"], allow_pickle=False)
    with np.load(noise_npz, allow_pickle=False) as nz:
        noise = Noise(x_T=nz["x_T"], posterior=nz["posterior"] if "posterior" in nz else None)
    backend = GraphBackend(cfg, lambda n: graphs[n] if n in graphs else graphs.setdefault(n, get(n)),
                           has=lambda n: (package / "specs" / f"{n}.spec.json").is_file())
    return restore(cfg, backend, video, text, noise, area=area)


def gate(package: Path, stage: str):
    from parity.policy import Policy

    return Policy.load(package / "policy.json").stage(stage, "fp32")


def stage_verdict(package: Path, stage: str, ref: np.ndarray, cand: np.ndarray) -> tuple[bool, str]:
    from ncnnport.metrics import compare, judge

    return judge(compare(ref.reshape(cand.shape), cand, what=stage), gate(package, stage))


def frames_verdict(package: Path, ref: np.ndarray, cand: np.ndarray) -> tuple[bool, dict[str, Any]]:
    """The policy's frame gate over image rows, with the 8-bit statistics beside it."""
    from ncnnport.metrics import compare, judge
    from ncnnport.models.seedvr2.frames import image_rows, image_stats

    ok, why = judge(compare(image_rows(ref), image_rows(cand), what="frames"), gate(package, "frames"))
    return ok, {**image_stats(ref, cand), "why": why}


# ---------------------------------------------------------------------------------------------
# bad input: one line naming the file, exit 2 (no package needed)


@pytest.mark.parametrize("content", [b"", b"not an image at all", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00"])
def test_bad_image_is_one_line_naming_it(seedvr2_exe, tmp_path, content):
    bad = tmp_path / "broken.png"
    bad.write_bytes(content)
    res = run_cpp(seedvr2_exe, "--package", tmp_path / "nope", "--input", bad, "--output", tmp_path / "out",
                  "--noise", tmp_path / "noise.npz")
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and str(bad) in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_bad_noise_file_is_one_line_naming_it(seedvr2_exe, tmp_path):
    from PIL import Image

    img = tmp_path / "in.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(img)
    noise = tmp_path / "noise.npz"
    np.savez_compressed(noise, x_T=np.zeros((16, 1, 4, 4), np.float32))
    res = run_cpp(seedvr2_exe, "--package", tmp_path / "nope", "--input", img, "--output", tmp_path / "out",
                  "--noise", noise)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert str(noise) in res.stderr and "compressed" in res.stderr


def test_output_inside_input_folder_is_refused(seedvr2_exe, tmp_path):
    from PIL import Image

    frames = tmp_path / "frames"
    frames.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(frames / "a.png")
    res = run_cpp(seedvr2_exe, "--package", tmp_path / "nope", "--input", frames, "--output", frames / "out",
                  "--noise", tmp_path / "noise.npz")
    assert res.returncode == 2 and "inside --input" in res.stderr, res.stderr


# ---------------------------------------------------------------------------------------------
# parity with the Python ncnn loop (slow: converts the tiny package)


@pytest.mark.slow
def test_cpp_frames_match_the_python_ncnn_loop(seedvr2_exe, package, tmp_path):
    for case in case_dirs(package):
        cpp = cpp_restore(seedvr2_exe, package, case, tmp_path / case.name)
        py = python_restore(package, case)
        # host preprocessing is bit-exact
        assert np.array_equal(cpp["stages"]["input"], py.stages["input"]), case.name
        for stage in GRAPH_STAGES:
            ok, why = stage_verdict(package, stage, py.stages[stage], cpp["stages"][stage])
            assert ok, f"{case.name} {stage}: {why}"
        assert cpp["frames"].shape == py.frames.shape
        # an image runs the VAE's single-frame twins (taps summed: a third of the conv work)
        vae = [g for g in cpp["json"]["graphs"] if g.startswith("vae_")]
        assert vae == ["vae_encode_image"] + [f"vae_decode_{k}_image" for k in range(4)], vae
        ok, stats = frames_verdict(package, py.frames, cpp["frames"])
        print(f"{case.name}: C++ vs Python ncnn loop frames: max {stats['image_max_abs']} level(s), "
              f"{stats['differing_bytes']} of {stats['total_bytes']} bytes differ, PSNR {stats['psnr_db']:.1f} dB")
        assert ok, f"{case.name}: {stats}"
        # the JSON the generic driver reads: sha256 / shape / statistics of the frames written
        from ncnnport.models.seedvr2.describe import frame_summary

        doc, summary = cpp["json"], frame_summary(cpp["frames"])
        assert doc["runtime"] == "cpp" and doc["frames_sha256"] == summary["frames_sha256"]
        assert doc["shape"] == summary["shape"]
        for key in ("mean", "std", "min", "max"):
            assert doc[key] == pytest.approx(summary[key], abs=1e-9), key
        for i, f in enumerate(doc["frames"]):
            assert f["sha256"] == hashlib.sha256(np.ascontiguousarray(cpp["frames"][i]).tobytes()).hexdigest()
        expected = json.loads((case / "case.json").read_text())["expected"]
        assert doc["noise"]["sha256"] == expected["noise"]["sha256"]


def test_stage_seconds_exclude_the_graph_loads(seedvr2_exe, package, tmp_path):
    """``seconds`` splits the run: graph stages, host steps and the lazy graph loads add up to the
    total, each second counted once. When a stage's timer included the loads inside it (on Vulkan
    20 s of a 23 s run on the H200), the parts summed to far more than the total."""
    case = case_dirs(package)[0]
    seconds = cpp_restore(seedvr2_exe, package, case, tmp_path)["json"]["seconds"]
    assert seconds["load_graphs"] > 0 and all(seconds[k] >= 0 for k in GRAPH_SECONDS), seconds
    parts = sum(v for k, v in seconds.items() if k != "total")
    assert parts <= seconds["total"] * 1.001 + 1e-4, seconds
    assert parts >= seconds["total"] * 0.9, seconds  # nothing large left unaccounted


@pytest.mark.slow
def test_cpp_frame_folder_matches_the_python_ncnn_loop(seedvr2_exe, package, tmp_path):
    """3 frames (padded to 5 by repeating the last): the VAE's time axis, the space-time
    depth-to-space between decoder stages and the padding frames dropped at the end."""
    from PIL import Image

    case = case_dirs(package)[0]
    first = np.asarray(Image.open(case / "input.png").convert("RGB"))
    video = np.stack([np.roll(first, 3 * k, axis=1) for k in range(3)])
    folder = tmp_path / "frames"
    folder.mkdir()
    for k, f in enumerate(video):
        Image.fromarray(f).save(folder / f"f{k:02d}.png")
    h, w = first.shape[:2]
    lat = (16, 2, (h - h % 16) // 8, (w - w % 16) // 8)
    rng = np.random.default_rng(1)
    noise = tmp_path / "noise.npz"
    np.savez(noise, x_T=rng.standard_normal(lat).astype(np.float32), posterior=rng.standard_normal(lat).astype(np.float32))
    res = run_cpp(seedvr2_exe, "--package", package, "--input", folder, "--output", tmp_path / "out",
                  "--noise", noise, "--area", str(h * w), "--dump-stages", tmp_path / "s",
                  "--json-out", tmp_path / "run.json")
    assert res.returncode == 0, res.stderr
    graphs = json.loads((tmp_path / "run.json").read_text())["graphs"]
    assert "vae_encode" in graphs and not any(g.endswith("_image") for g in graphs), graphs  # a clip
    out = np.stack([np.asarray(Image.open(p)) for p in sorted((tmp_path / "out").glob("frame_*.png"))])
    py = python_loop(package, video, noise, h * w)
    assert out.shape == py.frames.shape == (3, h, w, 3)
    assert np.array_equal(np.load(tmp_path / "s" / "input.npy"), py.stages["input"])
    for stage in GRAPH_STAGES:
        ok, why = stage_verdict(package, stage, py.stages[stage], np.load(tmp_path / "s" / f"{stage}.npy"))
        assert ok, f"{stage}: {why}"
    ok, stats = frames_verdict(package, py.frames, out)
    print(f"3-frame folder: max {stats['image_max_abs']} level(s), {stats['differing_bytes']} of "
          f"{stats['total_bytes']} bytes differ")
    assert ok, stats


@pytest.mark.slow
def test_cpp_resize_is_bit_exact_to_the_numpy_resize(seedvr2_exe, package, tmp_path):
    """--area below the input's own area exercises the antialiased bicubic downscale: the C++
    preprocess equals host_numpy's resize + the pipeline's clamp/crop/scale bit for bit."""
    from ncnnport.models.seedvr2 import host_numpy
    from ncnnport.models.seedvr2.pipeline import area_size, centre_offset
    from PIL import Image

    case = case_dirs(package)[-1]
    video = np.asarray(Image.open(case / "input.png").convert("RGB"))
    area = video.shape[0] * video.shape[1] // 3
    nh, nw = area_size(video.shape[0], video.shape[1], area)
    lat = (16, 1, (nh - nh % 16) // 8, (nw - nw % 16) // 8)
    noise = tmp_path / "noise.npz"
    rng = np.random.default_rng(0)
    np.savez(noise, x_T=rng.standard_normal(lat).astype(np.float32),
             posterior=rng.standard_normal(lat).astype(np.float32))
    res = run_cpp(seedvr2_exe, "--package", package, "--input", case / "input.png", "--output", tmp_path / "o",
                  "--noise", noise, "--area", str(area), "--dump-stages", tmp_path / "s")
    assert res.returncode == 0, res.stderr
    x = video.transpose(2, 0, 1).astype(np.float32) / np.float32(255.0)
    x = np.clip(host_numpy.resize_bicubic_aa(x, nh, nw), 0.0, 1.0)
    ch, cw = nh - nh % 16, nw - nw % 16
    top, left = centre_offset(nh, ch), centre_offset(nw, cw)
    want = (x[:, top:top + ch, left:left + cw] * np.float32(2.0) - np.float32(1.0))[:, None]
    assert np.array_equal(np.load(tmp_path / "s" / "input.npy"), want)


@pytest.mark.slow
@pytest.mark.parametrize("perturb,stage", [("swap-shift", "velocity"), ("flip-rope", "velocity")])
def test_a_perturbed_cpp_loop_fails_the_gates(seedvr2_exe, package, tmp_path, perturb, stage):
    """The comparison above would catch a C++ loop that alternates the window shift the wrong
    way round or builds RoPE tables with h and w exchanged (on the multi-window case)."""
    case = [c for c in case_dirs(package) if "multiwindow" in c.name][0]
    cpp = cpp_restore(seedvr2_exe, package, case, tmp_path, "--perturb", perturb)
    py = python_restore(package, case)
    ok, why = stage_verdict(package, stage, py.stages[stage], cpp["stages"][stage])
    assert not ok, f"{perturb} went unnoticed at {stage}: {why}"
    frames_ok, stats = frames_verdict(package, py.frames, cpp["frames"])
    print(f"{perturb}: frames max {stats['image_max_abs']} levels, {stats['differing_bytes']} bytes differ")
    assert not frames_ok


@pytest.mark.slow
def test_noise_of_the_wrong_shape_is_one_line(seedvr2_exe, package, tmp_path):
    case = case_dirs(package)[0]
    noise = tmp_path / "noise.npz"
    np.savez(noise, x_T=np.zeros((16, 1, 3, 3), np.float32))
    res = run_cpp(seedvr2_exe, "--package", package, "--input", case / "input.png", "--output", tmp_path / "o",
                  "--noise", noise)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert str(noise) in res.stderr and "x_T" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode,suffix", [("RGB", ".jpg"), ("L", ".jpg"), ("RGBA", ".png"), ("P", ".png"), ("L", ".png")])
def test_image_decoding_matches_pil(seedvr2_exe, package, tmp_path, mode, suffix):
    """JPEG (libjpeg-turbo, as PIL) and grey / palette / alpha PNGs decode to the bytes PIL's
    ``convert("RGB")`` gives: the preprocessed input is bit-identical to the Python one."""
    from PIL import Image

    from ncnnport.models.seedvr2.pipeline import preprocess

    rng = np.random.default_rng(2)
    img = Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).convert(mode)
    path = tmp_path / f"in{suffix}"
    img.save(path)
    lat = (16, 1, 6, 8)
    noise = tmp_path / "noise.npz"
    np.savez(noise, x_T=np.zeros(lat, np.float32))
    res = run_cpp(seedvr2_exe, "--package", package, "--input", path, "--output", tmp_path / "o",
                  "--noise", noise, "--dump-stages", tmp_path / "s")
    assert res.returncode == 0, res.stderr
    with Image.open(path) as im:
        want = preprocess(np.asarray(im.convert("RGB"))[None], 48 * 64)
    assert np.array_equal(np.load(tmp_path / "s" / "input.npy"), want)
