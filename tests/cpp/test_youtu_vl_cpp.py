"""The Youtu-VL C++ executable (runtime/cpp/apps/youtu_vl) and ``parity youtu-vl --runtime cpp``.

Slow tests build it (`make cpp`, ncnn from the version-keyed cache), convert the tiny preset and
compare the executable with the torch-free Python package loop (models/youtu_vl/packaged.py):
the processor's pixel_values bytes (upscale, downscale, sizes off the patch grid, EXIF-rotated
JPEGs and a PNG eXIf chunk), token ids on text-only and image prompts (>= 128 new tokens), and
perturbed loops (vision windows out of order, RoPE positions shifted) that must NOT match.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp")) / "ncnnport-youtu-vl"
NEW_TOKENS = 128


def test_port_names_the_executable_and_its_cases():
    from ncnnport.models.youtu_vl import cpp_cases
    from ncnnport.models.youtu_vl.port import PORT

    assert PORT.cpp_executable == "ncnnport-youtu-vl"
    argv = cpp_cases.executable_argv(Path("pkg"), None, "hi", 9)
    assert "--image" not in argv and argv[argv.index("--max-new-tokens") + 1] == "9"
    assert cpp_cases.executable_argv(Path("pkg"), Path("/x.png"), "hi", 9)[-2:] == ["--image", "/x.png"]


def test_fixture_files_follow_e2e_parity_per_preset(tmp_path):
    from types import SimpleNamespace

    from ncnnport.models.youtu_vl import cpp_cases
    from ncnnport.models.youtu_vl.fixtures import FIXTURES
    from ncnnport.models.youtu_vl.port import REAL_FIXTURES

    def names(preset, inputs=()):
        ctx = SimpleNamespace(loaded=SimpleNamespace(preset=preset), user_inputs=list(inputs))
        return cpp_cases.fixture_files(ctx, tmp_path / preset, REAL_FIXTURES)

    tiny = names("tiny", [tmp_path / "mine.jpg"])
    assert [n for n, _, _ in tiny] == [f.name for f in FIXTURES] + ["input:mine.jpg"]
    assert all((p is None) == (n == "text_only") for n, p, _ in tiny[:-1])
    assert all(p.is_file() for _, p, _ in tiny[:-1] if p is not None)
    assert sorted(n for n, _, _ in names("real")) == sorted(REAL_FIXTURES)


# ---------------------------------------------------------------------------------------------
# the executable on a tiny package (slow: builds and converts)


@pytest.fixture(scope="module")
def exe(built_cpp) -> Path:
    return built_cpp(EXE, "NCNNPORT_CPP_BUILD")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    from ncnnport.stages import convert_stage, prepare
    from ncnnport.targets import Target

    return Path(convert_stage(prepare(Target("youtu-vl", "tiny", None, tmp_path_factory.mktemp("youtu")))))


def save_exif(image, path: Path, orientation: int, fmt: str) -> Path:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    image.save(path, format=fmt, exif=exif.tobytes(), **({"quality": 90} if fmt == "JPEG" else {}))
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, tuple[Path, int | None]]:
    """name -> (file, patch cap or None for model.json's)."""
    from ncnnport.models.youtu_vl.fixtures import synthetic_image

    d = tmp_path_factory.mktemp("images")
    out: dict[str, tuple[Path, int | None]] = {}
    for name, (h, w), cap in [("upscale_5x7", (5, 7), None), ("off_grid_200x230", (200, 230), None),
                              ("downscale_1000x700", (1000, 700), 64), ("strip_40x900", (40, 900), 48),
                              ("multi_window_180x270", (180, 270), None)]:
        path = d / f"{name}.png"
        synthetic_image(h, w, seed=3).save(path)
        out[name] = (path, cap)
    base = synthetic_image(70, 110, seed=4)
    for k in range(1, 9):
        out[f"jpeg_exif{k}"] = (save_exif(base, d / f"exif{k}.jpg", k, "JPEG"), None)
    out["png_exif6"] = (save_exif(base, d / "exif6.png", 6, "PNG"), None)
    return out


def run_cpp(exe: Path, package: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), "--package", str(package), *argv], capture_output=True, text=True,
                          timeout=600, check=False)


def python_ids(package: Path, prompt: str, image: Path | None) -> list[int]:
    from ncnnport.fsutil import read_json
    from ncnnport.models.youtu_vl import packaged
    from ncnnport.runtime.lazy_modules import LazyModules

    doc = read_json(package / "model.json")
    return packaged.generate_ids(LazyModules(package), packaged.packaged_config(package, doc),
                                 packaged.packaged_tokenizer(package, doc), prompt, image, NEW_TOKENS)


def cpp_ids(exe: Path, package: Path, prompt: str, image: Path | None, out: Path, *extra: str) -> dict:
    argv = ["--prompt", prompt, "--max-new-tokens", str(NEW_TOKENS), "--json-out", str(out), *extra]
    res = run_cpp(exe, package, *argv, *(["--image", str(image)] if image else []))
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
def test_pixel_values_are_the_python_processor_bytes(exe, package, images, tmp_path):
    from ncnnport.models.youtu_vl.packaged import packaged_config
    from ncnnport.models.youtu_vl.processor import load_image, process_image

    cfg = packaged_config(package, json.loads((package / "model.json").read_text()))
    for name, (path, cap) in images.items():
        pixels, out = tmp_path / f"{name}.f32", tmp_path / f"{name}.json"
        argv = ["--image", str(path), "--preprocess-only", "--pixels-out", str(pixels), "--json-out", str(out)]
        res = run_cpp(exe, package, *argv, *(["--max-patches", str(cap)] if cap else []))
        assert res.returncode == 0, (name, res.stderr)
        want = process_image(load_image(path), cfg.vision, cfg.processor, cap)
        got = json.loads(out.read_text())["image"]
        assert (tuple(got["grid_hw"]), tuple(got["original_hw"])) == (want.grid_hw, want.original_hw), name
        assert pixels.read_bytes() == want.pixel_values.astype(np.float32).tobytes(), name
    # the EXIF cases really turn the picture: a rotated one differs from the stored orientation
    r1 = json.loads((tmp_path / "jpeg_exif1.json").read_text())["image"]["original_hw"]
    r6 = json.loads((tmp_path / "jpeg_exif6.json").read_text())["image"]["original_hw"]
    assert r6 == r1[::-1]


@pytest.mark.slow
def test_tokens_equal_the_python_package_loop(exe, package, images, tmp_path):
    cases = [("Tell me a short story about a red house.", None),
             ("What is in the picture?", images["multi_window_180x270"][0]),
             ("Describe this image.", images["jpeg_exif6"][0])]
    for i, (prompt, image) in enumerate(cases):
        got = cpp_ids(exe, package, prompt, image, tmp_path / f"{i}.json")
        want = python_ids(package, prompt, image)
        assert got["chunks"][0]["token_ids"] == want, (prompt, image)
        assert len(want) == NEW_TOKENS  # the tiny preset does not stop early on these
        timing = got["timing"]
        assert 0 < timing["decode_graph_s"] <= timing["decode_s"]
        assert 0 < timing["decode_layers_s"] < timing["decode_graph_s"]  # the layers' share (item 2's flatness)
        assert 0 <= timing["decode_layers_stream_s"] <= timing["decode_layers_s"]  # of which the weights' streams
        # MLA's absorbed projections (MemoryData) went to their MatMuls uncopied, ids unchanged
        assert timing["memory_data_shares"] > 0


@pytest.mark.slow
def test_windows_run_side_by_side_with_the_same_tokens(exe, package, images, tmp_path):
    """On 3 threads the window segments (spec concurrent_calls 4) load for one thread per window
    and run 3 windows at a time; --serial-windows loads them for 3 threads, one window at a time.
    Both give the Python loop's tokens."""
    prompt, image = "What is in the picture?", images["multi_window_180x270"][0]
    side = cpp_ids(exe, package, prompt, image, tmp_path / "side.json", "--threads", "3")
    serial = cpp_ids(exe, package, prompt, image, tmp_path / "serial.json", "--threads", "3", "--serial-windows")
    windowed = side["timing"]["concurrent_calls"]
    assert set(windowed) == {"vision_seg0", "vision_seg2"}, windowed  # tiny: segments 1 and 3 are full attention
    # 2 windows: both side by side, so the net for a lone call is never opened
    assert all(v == {"workers": 3, "threads_each": 1, "split_net": True, "solo_net": False}
               for v in windowed.values()), windowed
    assert serial["timing"]["concurrent_calls"] == {}
    for run in (side, serial):  # the vision graphs' own time, inside the vision stage's
        assert 0 < run["timing"]["vision_graph_s"] <= run["timing"]["vision_s"]
    want = python_ids(package, prompt, image)
    assert side["chunks"][0]["token_ids"] == serial["chunks"][0]["token_ids"] == want


@pytest.mark.slow
def test_a_lone_window_runs_on_all_the_threads_with_the_same_tokens(exe, package, images, tmp_path):
    """An image of one window (tiny: 5x7 pixels): the window segments, split for 3 windows at a
    time, run that lone window on the same graph loaded for all 3 threads (solo_net), as the
    Python loop does (NcnnModule.run_each), and the split net itself is never loaded; the tokens
    are the Python loop's."""
    prompt, image = "What is in the picture?", images["upscale_5x7"][0]
    got = cpp_ids(exe, package, prompt, image, tmp_path / "lone.json", "--threads", "3")
    windowed = got["timing"]["concurrent_calls"]
    assert set(windowed) == {"vision_seg0", "vision_seg2"}, windowed
    # and only that net: the split one (loaded on a batch of several) never was
    assert all(v == {"workers": 3, "threads_each": 1, "split_net": False, "solo_net": True}
               for v in windowed.values()), windowed
    assert got["chunks"][0]["token_ids"] == python_ids(package, prompt, image)


@pytest.mark.slow
@pytest.mark.parametrize("perturb,prompt,image", [
    ("reverse-windows", "What is in the picture?", "multi_window_180x270"),
    ("rope-shift", "Tell me a short story about a red house.", None)])
def test_a_perturbed_loop_fails_the_token_check(exe, package, images, tmp_path, perturb, prompt, image):
    path = images[image][0] if image else None
    got = cpp_ids(exe, package, prompt, path, tmp_path / "p.json", "--perturb", perturb)
    assert got["chunks"][0]["token_ids"] != python_ids(package, prompt, path)


@pytest.mark.slow
def test_bad_inputs_are_one_line_exit_2(exe, package, images, tmp_path):
    not_image = tmp_path / "x.png"
    not_image.write_bytes(b"\x89PNG\r\n\x1a\n nonsense")
    truncated = tmp_path / "cut.jpg"
    truncated.write_bytes(images["jpeg_exif1"][0].read_bytes()[:200])
    tampered = tmp_path / "pkg"
    shutil.copytree(package, tampered)
    with open(tampered / "ncnn" / "lm_head.ncnn.param", "a") as f:
        f.write("\n")
    good = images["off_grid_200x230"][0]
    cases = [(package, not_image, str(not_image)), (package, tmp_path / "missing.png", "missing.png"),
             (package, truncated, str(truncated)), (package, tmp_path, str(tmp_path)),
             (tampered, good, "lm_head.ncnn.param"), (tmp_path / "nowhere", good, "nowhere")]
    for pkg, image, needle in cases:
        res = run_cpp(exe, pkg, "--image", str(image), "--prompt", "hi", "--json-out", str(tmp_path / "o.json"))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], (needle, res.stderr)


@pytest.mark.slow
def test_parity_runtime_cpp_rows(exe, package, images, monkeypatch):
    from ncnnport.drivers import cpp_parity
    from ncnnport.stages import prepare
    from ncnnport.targets import Target

    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(exe.parent))
    prep = prepare(Target("youtu-vl", "tiny", None, package.parents[2]))
    rotated = images["jpeg_exif8"][0]
    summary = cpp_parity.run_cpp_parity(prep, package, user_inputs=[rotated])
    assert summary["runtime"] == "cpp" and summary["gates_passed"], [r for r in summary["e2e"] if not r["passed"]]
    assert all(r["runtime"] == "cpp" for r in summary["e2e"])
    fixtures = {r["fixture"] for r in summary["e2e"]}
    assert {"text_only", "six_windows", f"input:{rotated.name}"} <= fixtures


# ---------------------------------------------------------------------------------------------
# memory: a long prompt holds one layer call's activations, not the sum over the layer graphs

def _peak_rss_bytes(argv: list[str], tmp_path: Path) -> int:
    """Peak RSS of one run of ``argv``: the child's own ru_maxrss, from reaping it with wait4.
    Why not bench-cpp's sampler (ChildPeak): a short run can end between two samples, and its
    fallback, the lifetime peak of every child this process reaped, belongs to an earlier child
    when the test shares a process with others (pytest-xdist): a CI run read the short prompt as
    0 and the long one's whole RSS as its growth, 13.8 score blobs."""
    err_path = tmp_path / "stderr.txt"
    with open(os.devnull, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        watchdog = threading.Timer(600, proc.kill)  # the timeout subprocess.run had
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, so Popen must not wait again
    assert proc.returncode == 0, err_path.read_text()
    return usage.ru_maxrss * 1024  # KiB on Linux


@pytest.mark.slow
def test_a_long_prompt_holds_one_layer_calls_activations(exe, package, tmp_path):
    """A prefill of S rows makes each layer call hold a few [heads, S, S] fp32 score blobs at
    once (the new rows' two score terms and their sum: 3 measured). ncnn's default per-Net pool
    kept every layer graph's blocks after its call and handed large free blocks to small
    requests: the tiny package at S=3038 then peaked 11.8 score blobs above a short prompt
    (3.0 without it, sampled). The bound, 6 blobs, is twice one call's measured live set."""
    dims = json.loads((package / "model.json").read_text())["dims"]
    argv = [str(exe), "--package", str(package), "--max-new-tokens", "2", "--no-check"]
    short = _peak_rss_bytes(argv + ["--prompt", "sky"], tmp_path)
    out = tmp_path / "long.json"
    extra = _peak_rss_bytes(argv + ["--prompt", " ".join(["sky"] * 1000), "--json-out", str(out)], tmp_path) - short
    rows = json.loads(out.read_text())["chunks"][0]["prompt_tokens"]
    assert rows > 2000, rows  # long enough that the score blobs dominate
    score_blob = dims["heads"] * rows * rows * 4
    assert extra <= 6 * score_blob, f"{extra / score_blob:.1f} score blobs of {score_blob / 2**20:.0f} MiB"
