"""The end-to-end measurement mode (models/seedvr2/e2e_measure.py): one JSON line per process
with the stage seconds and peak RSS of a tiled restoration, and the frames' distance between
the ncnn package and the torch reference under the fp32 frames gate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ncnnport.models.seedvr2.e2e_measure import frames_distance, main, parse_size
from ncnnport.targets import Target

POLICY = Path(__file__).resolve().parents[3] / "models" / "seedvr2" / "policy.json"
TINY = ["--preset", "tiny", "--size", "64x64", "--tile", "32", "--overlap", "8", "--threads", "1"]


def _record(capsys) -> dict:
    """The one JSON line on stdout (tile progress goes to stderr)."""
    out = capsys.readouterr()
    lines = [ln for ln in out.out.splitlines() if ln.strip()]
    assert len(lines) == 1, out.out
    return json.loads(lines[0])


def test_torch_run_prints_stage_seconds_and_rss_of_a_tiled_restore(tmp_path, capsys) -> None:
    frames = tmp_path / "torch.npy"
    assert main(["--runtime", "torch", *TINY, "--save", str(frames)]) == 0
    rec = _record(capsys)
    assert rec["stage"] == "e2e" and rec["runtime"] == "torch" and rec["size"] == "64x64"
    assert (rec["tile"], rec["overlap"], rec["preset"], rec["dit_blocks"]) == (32, 8, "tiny", 2)
    assert set(rec["stage_seconds"]) == {"vae_encode", "dit", "vae_decode", "host"}
    assert abs(sum(rec["stage_seconds"].values()) - rec["seconds"]) < 0.05
    assert set(rec["peak_rss_after_stage_gb"]) == {"vae_encode", "dit", "vae_decode"}
    assert rec["peak_rss_gb"] >= rec["rss_before_call_gb"] > 0
    saved = np.load(frames, allow_pickle=False)
    assert saved.dtype == np.uint8 and list(saved.shape) == rec["frames_shape"] == [1, 64, 64, 3]


def test_the_vae_really_runs_in_tiles(capsys) -> None:
    """64 px at 32 px tiles: more than one encoder and decoder call (a frame within one tile
    would not be tiled, and the measurement would say nothing about tiling)."""
    assert main(["--runtime", "torch", *TINY]) == 0
    calls = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("call ")]
    assert len(calls) >= 2 * 4


def test_bad_options_are_one_line_naming_the_option(tmp_path, capsys) -> None:
    assert main(["--runtime", "torch", "--size", "60x64"]) == 2
    assert "--size 60x64" in capsys.readouterr().err
    assert main(["--runtime", "torch", *TINY[:4], "--tile", "30"]) == 2
    assert "--vae-tile 30" in capsys.readouterr().err
    assert main(["--runtime", "ncnn", *TINY, "--build-dir", str(tmp_path)]) == 2
    assert "ncnnport convert seedvr2 --preset tiny" in capsys.readouterr().err
    assert main(["--runtime", "torch", *TINY, "--compare", str(tmp_path / "none.npy")]) == 2
    assert "--compare" in capsys.readouterr().err


def test_parse_size() -> None:
    assert parse_size("720x1280") == (720, 1280)
    with pytest.raises(ValueError, match="--size 1x"):
        parse_size("1x")


def test_frames_distance_applies_the_fp32_frames_gate(tmp_path) -> None:
    ref = np.random.default_rng(0).integers(0, 250, (1, 16, 16, 3), dtype=np.uint8)
    path = tmp_path / "ref.npy"
    np.save(path, ref)
    near = ref.copy()
    near[0, 3, 4, 1] += 1
    assert frames_distance(near, path, POLICY)["frames_gate"] == "pass"
    far = ref.copy()
    far[0, 3, 4, 1] += 5
    d = frames_distance(far, path, POLICY)
    assert d["frames_gate"].startswith("fail") and d["image_max_abs"] == 5


@pytest.mark.slow
def test_ncnn_package_and_torch_frames_agree_within_the_frames_gate(tmp_path_factory, capsys) -> None:
    """The ncnn run (the converted tiny package, as ``run --package`` drives it) against the
    torch run's saved frames, each with the same tiling and noise."""
    from ncnnport.stages import convert_stage, prepare

    root = tmp_path_factory.mktemp("build")
    package = Path(convert_stage(prepare(Target("seedvr2", "tiny", None, root, layers=2))))
    torch_frames = root / "torch.npy"
    assert main(["--runtime", "torch", *TINY, "--save", str(torch_frames)]) == 0
    capsys.readouterr()
    assert main(["--runtime", "ncnn", *TINY, "--low-memory", "--package", str(package),
                 "--compare", str(torch_frames)]) == 0
    rec = _record(capsys)
    assert rec["runtime"] == "ncnn" and rec["low_memory"] is True and rec["dit_blocks"] == 2
    assert rec["vs"]["frames_gate"] == "pass", rec["vs"]
    assert rec["vs"]["image_max_abs"] <= 1
