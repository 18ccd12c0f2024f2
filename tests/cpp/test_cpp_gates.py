"""The C++ runtime under the harness's gates (issue 13 items 1, 3 and 4):

* ``--verify`` on the per-model executables: the package's manifest and golden vectors through
  ``ncnnport::run_verify``, exit 0 / 1 / 2 as ``ncnnport-cpp verify``;
* frame judgement in ``parity --runtime cpp`` (SeedVR2): bytes equal to the Python package loop
  pass as "byte-identical", otherwise the policy's frames gate with the level difference named;
* the nightly's cpp rows (run, skipped with a reason, or failing the night);
* packaged e2e cases through an executable (``cpp_package_cases``, what ``make cpp-aarch64-verify``
  runs under qemu), judged against the package's expected values.

Fast tests use fakes; slow tests build (``make cpp``) and convert the tiny presets.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from ncnnport.contract import Tolerance
from ncnnport.drivers import cpp_package_cases, cpp_parity
from ncnnport.registry import CppCase
from tests.cpp.make_targets import make_cpp
from tests.cpp.packages import tiny_package

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
FRAMES_GATE = Tolerance(min_cosine=0.9999, max_abs_rel=0.0, max_abs_floor=1.0)  # seedvr2 fp32 "frames": levels


def video(seed: int = 0, shape=(2, 8, 12, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def write_result(folder: Path, frames: np.ndarray, sha: str | None = None) -> dict:
    """A fake ``ncnnport-seedvr2 --json-out`` result with its PNG frames."""
    folder.mkdir(parents=True, exist_ok=True)
    listed = []
    for i, f in enumerate(frames):
        path = folder / f"frame_{i:05d}.png"
        Image.fromarray(f).save(path)
        listed.append({"path": str(path)})
    return {"runtime": "cpp", "frames": listed, "frames_sha256": sha or cpp_parity.frames_sha256(frames)}


def frame_case(python: np.ndarray, reference: np.ndarray | None = None) -> CppCase:
    return CppCase(fixture="fx", argv=[], python_tokens=[], reference_tokens=[], python_frames=python,
                   reference_frames=reference, frames_gate=FRAMES_GATE)


# ---------------------------------------------------------------------------------------------
# frame judgement in the generic driver (fast)


def test_identical_frames_pass_as_byte_identical(tmp_path):
    frames = video()
    rows = cpp_parity.case_records(frame_case(frames), write_result(tmp_path, frames), "fake")
    (row,) = rows
    assert row["passed"] and row["byte_identical"] and row["reason"] == "byte-identical"
    assert row["runtime"] == "cpp" and row["stage"] == "frames (cpp vs python package loop)"
    assert row["differing_bytes"] == 0 and row["image_max_abs"] == 0


def test_one_level_in_a_few_bytes_passes_the_gate_and_says_so(tmp_path):
    python = video()
    cpp = python.copy()
    cpp[0, 3, 4, 1] ^= 1  # one byte one level off
    (row,) = cpp_parity.case_records(frame_case(python), write_result(tmp_path, cpp), "fake")
    assert row["passed"] and not row["byte_identical"]
    assert row["differing_bytes"] == 1 and row["image_max_abs"] == 1 and row["total_bytes"] == python.size
    assert row["reason"].startswith(f"1 of {python.size} bytes differ, max 1 level(s)")
    assert "GCC-12" in row["reason"] and "GCC-14" in row["reason"]


def test_frames_beyond_the_gate_fail(tmp_path):
    python = video()
    cpp = python.copy()
    cpp[0, :4] = 255 - cpp[0, :4]  # a broken loop: whole rows wrong
    (row,) = cpp_parity.case_records(frame_case(python), write_result(tmp_path, cpp), "fake")
    assert not row["passed"] and row["image_max_abs"] > 2


def test_reference_frames_get_their_own_row(tmp_path):
    python = video()
    reference = python.copy()
    reference[1, 0, 0, 0] ^= 1
    rows = cpp_parity.case_records(frame_case(python, reference), write_result(tmp_path, python), "fake")
    assert [r["stage"] for r in rows] == ["frames (cpp vs python package loop)", "frames (cpp vs torch reference)"]
    assert rows[0]["byte_identical"] and rows[1]["passed"] and rows[1]["image_max_abs"] == 1


def test_frames_that_do_not_hash_to_the_claimed_sha256_are_refused(tmp_path):
    frames = video()
    out = write_result(tmp_path, frames, sha="0" * 64)
    with pytest.raises(cpp_parity.CppRuntimeError, match="do not hash to its frames_sha256"):
        cpp_parity.case_records(frame_case(frames), out, "fake")


def test_frame_shape_mismatch_is_a_failed_row(tmp_path):
    (row,) = cpp_parity.case_records(frame_case(video()), write_result(tmp_path, video(shape=(1, 8, 12, 3))), "fake")
    assert not row["passed"] and "cpp frames [1, 8, 12, 3], expected [2, 8, 12, 3]" in row["reason"]


def test_token_results_still_need_chunks(tmp_path):
    case = CppCase(fixture="fx", argv=[], python_tokens=[[1, 2]], reference_tokens=[[1, 2]])
    rows = cpp_parity.case_records(case, {"chunks": [{"token_ids": [1, 2]}], "text": "t"}, "fake")
    assert all(r["passed"] for r in rows)
    with pytest.raises(cpp_parity.CppRuntimeError, match="no chunks"):
        cpp_parity.case_records(case, {"frames": []}, "fake")


# ---------------------------------------------------------------------------------------------
# the nightly's cpp rows (fast, fakes)


def fake_prep(executable: str | None = "ncnnport-fake"):
    return SimpleNamespace(port=SimpleNamespace(cpp_executable=executable), target=SimpleNamespace(model="toy"))


def test_nightly_skips_cpp_rows_in_one_line_when_nothing_can_build(tmp_path, monkeypatch):
    from ncnnport import nightly

    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(tmp_path))
    monkeypatch.setattr(nightly.shutil, "which", lambda tool: None if tool == "cmake" else f"/usr/bin/{tool}")
    cpp = nightly.cpp_parity(fake_prep(), tmp_path)
    assert not cpp["ran"] and cpp["passed"] and cpp["rows"] == []
    line = nightly.cpp_line(cpp)
    assert line.startswith("cpp rows skipped: ") and "ncnnport-fake is not built and cmake not found" in line
    assert "\n" not in line
    assert "has no C++ runtime" in nightly.cpp_line(nightly.cpp_parity(fake_prep(None), tmp_path))


def test_nightly_turns_an_executable_failure_into_a_failed_row(tmp_path, monkeypatch):
    from ncnnport import nightly
    from ncnnport.drivers import cpp_parity as driver

    (tmp_path / "ncnnport-fake").write_text("")
    monkeypatch.setenv("NCNNPORT_CPP_BUILD", str(tmp_path))

    def broken(prep, package):
        raise driver.CppRuntimeError("ncnnport-fake exited 1: boom")

    monkeypatch.setattr(driver, "run_cpp_parity", broken)
    cpp = nightly.cpp_parity(fake_prep(), tmp_path)
    assert cpp["ran"] and not cpp["passed"]
    assert cpp["rows"][0]["runtime"] == "cpp" and "boom" in cpp["rows"][0]["reason"]


def test_a_failing_cpp_row_fails_the_nightly_and_lands_in_summary_json(tmp_path, monkeypatch, capsys):
    import ncnnport.nightly as nightly
    import ncnnport.stages as stages
    from ncnnport.targets import Target
    from tests.reports.test_reports import summary as toy_summary

    row = {"fixture": "fx", "stage": "frames (cpp vs python package loop)", "kind": "frames", "runtime": "cpp",
           "passed": False, "reason": "12 of 100 bytes differ, max 9 level(s)"}
    monkeypatch.setattr(stages, "prepare", lambda t: t)
    monkeypatch.setattr(stages, "convert_stage", lambda prep: tmp_path)
    monkeypatch.setattr(nightly, "full_parity", lambda prep, pkg: toy_summary())
    monkeypatch.setattr(nightly, "stability", lambda prep, pkg: {"passed": True, "rounds": 0})
    monkeypatch.setattr(nightly, "cpp_parity", lambda prep, pkg: {"ran": True, "passed": False, "reason": "",
                                                                   "rows": [row]})
    target = Target("toy", "tiny", None, tmp_path)
    assert nightly.run_nightly([target], tmp_path / "nightly") == 1
    kept = json.loads(next((tmp_path / "nightly" / "history").glob("*/toy/summary.json")).read_text())
    assert [r for r in kept["e2e"] if r.get("runtime") == "cpp"] == [row]
    assert kept["cpp"]["ran"] and not kept["gates_passed"]
    assert "cpp rows (1): FAIL, 1 failed; first: fx frames (cpp vs python package loop)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# packaged cases through an executable (fast judging; the qemu run is in test_aarch64.py)


def disk_case(tmp_path: Path, expected: dict, inputs: dict | None = None):
    from ncnnport.package.cases import CaseOnDisk

    return CaseOnDisk("c", tmp_path, inputs or {}, {}, expected)


def test_package_case_tokens_must_equal_the_expected_ids(tmp_path):
    case = disk_case(tmp_path, {"token_ids": [[4, 5, 6]]})
    ok = cpp_package_cases.judge(case, {"chunks": [{"token_ids": [4, 5, 6]}]}, "fake", tmp_path)
    bad = cpp_package_cases.judge(case, {"chunks": [{"token_ids": [4, 9, 6]}]}, "fake", tmp_path)
    assert [r["passed"] for r in ok] == [True] and [r["passed"] for r in bad] == [False]
    assert bad[0]["first_mismatch"] == 1


def test_package_case_frames_by_sha256_then_by_the_packaged_frames_gate(tmp_path):
    expected = video(shape=(1, 8, 12, 3))
    Image.fromarray(expected[0]).save(tmp_path / "expected.png")
    (tmp_path / "policy.json").write_text(json.dumps({"version": 1, "precisions": {"fp32": {"stages": {
        "frames": {"min_cosine": 0.9999, "max_abs_rel": 0.0, "max_abs_floor": 1.0}}}}}))
    case = disk_case(tmp_path, {"frames_sha256": cpp_parity.frames_sha256(expected)},
                     {"expected": tmp_path / "expected.png"})
    same = cpp_package_cases.judge(case, write_result(tmp_path / "a", expected), "fake", tmp_path)
    assert same[0]["passed"] and same[0]["reason"] == "byte-identical"
    near = expected.copy()
    near[0, 1, 1, 1] ^= 1
    close = cpp_package_cases.judge(case, write_result(tmp_path / "b", near), "fake", tmp_path)
    assert close[0]["passed"] and close[0]["differing_bytes"] == 1
    far = 255 - expected
    assert not cpp_package_cases.judge(case, write_result(tmp_path / "c", far), "fake", tmp_path)[0]["passed"]


def test_frames_are_judged_only_where_the_models_pipeline_has_a_frames_stage(tmp_path):
    """The packaged policy is read with the model's policy stages: a frames gate asked of a model
    without one is refused, not answered by the mode's default gate."""
    expected = video(shape=(1, 8, 12, 3))
    Image.fromarray(expected[0]).save(tmp_path / "expected.png")
    (tmp_path / "policy.json").write_text(json.dumps({"version": 1, "precisions": {"fp32": {}}}))
    case = disk_case(tmp_path, {"frames_sha256": "0" * 64}, {"expected": tmp_path / "expected.png"})
    out = write_result(tmp_path / "a", expected)
    assert cpp_package_cases.judge(case, out, "fake", tmp_path, stages=("frames", "latent"))[0]["passed"]
    with pytest.raises(ValueError, match=r"no stage 'frames' in this model's pipeline \(last_logits\)"):
        cpp_package_cases.judge(case, out, "fake", tmp_path, stages=("last_logits",))


def test_the_smallest_case_with_an_input_file_is_chosen(tmp_path):
    from ncnnport.package.cases import CaseOnDisk

    (tmp_path / "big").write_bytes(b"x" * 100)
    (tmp_path / "small").write_bytes(b"x" * 10)
    cases = [CaseOnDisk("b", tmp_path, {"a": tmp_path / "big"}, {}, {}),
             CaseOnDisk("s", tmp_path, {"a": tmp_path / "small"}, {}, {}),
             CaseOnDisk("text_only", tmp_path, {}, {}, {})]  # no input: skips the vision stages
    assert cpp_package_cases.smallest_case(cases).name == "s"
    assert cpp_package_cases.smallest_case(cases[2:]).name == "text_only"


def test_a_flat_expected_sequence_is_one_sequence(tmp_path):
    """Youtu-VL's cases store one flat id list, Qwen3-ASR's one list per chunk."""
    case = disk_case(tmp_path, {"token_ids": [7, 8]})
    rows = cpp_package_cases.judge(case, {"chunks": [{"token_ids": [7, 8]}]}, "fake", tmp_path)
    assert [r["passed"] for r in rows] == [True] and rows[0]["tokens_compared"] == 2


def test_a_model_without_an_executable_is_skipped_in_one_line(monkeypatch, capsys, tmp_path):
    import ncnnport.registry as registry

    monkeypatch.setattr(registry, "get_port", lambda name: SimpleNamespace(cpp_executable=None))
    assert cpp_package_cases.main(["toy", str(tmp_path), "--exe-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "cpp e2e toy: skipped (the model has no C++ executable)"


# ---------------------------------------------------------------------------------------------
# the executables (slow: `make cpp` and the tiny packages)


@pytest.fixture(scope="module")
def built() -> Path:
    """`make cpp` once (ncnn from the version-keyed cache, then an incremental CMake build)."""
    if "NCNNPORT_CPP_BUILD" not in os.environ:
        make_cpp()
    return BUILD


def perturbed_copy(src: Path, dest: Path) -> tuple[Path, str]:
    """A copy of ``src`` with one weight of its largest graph changed and the manifest re-hashed,
    so only the golden vectors can tell: (package, the graph changed)."""
    pkg = Path(shutil.copytree(src, dest))
    rel = max((p for p in (pkg / "ncnn").glob("*.ncnn.bin")), key=lambda p: p.stat().st_size).relative_to(pkg)
    data = bytearray((pkg / rel).read_bytes())
    at = (len(data) // 2) & ~3
    struct.pack_into("<f", data, at, struct.unpack_from("<f", data, at)[0] + 8.0)
    (pkg / rel).write_bytes(bytes(data))
    manifest = json.loads((pkg / "manifest.json").read_text())
    manifest["files"][str(rel)] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (pkg / "manifest.json").write_text(json.dumps(manifest))
    return pkg, rel.name.removesuffix(".ncnn.bin")


EXECUTABLES = {"qwen3-asr": "ncnnport-qwen3-asr", "seedvr2": "ncnnport-seedvr2"}


def run(exe: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(EXECUTABLES))
def test_verify_flag_passes_the_tiny_package_as_ncnnport_cpp_verify_does(built, model):
    pkg = tiny_package(model)
    res = run(built / EXECUTABLES[model], "--package", pkg, "--verify")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    reference = run(built / "ncnnport-cpp", "verify", pkg)
    assert reference.returncode == 0
    assert res.stdout == reference.stdout  # same table, same rows, same heading
    assert res.stdout.rstrip().endswith(" 0 failed")


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(EXECUTABLES))
def test_verify_flag_fails_a_perturbed_weight_with_a_rehashed_manifest(built, model, tmp_path):
    pkg, graph = perturbed_copy(tiny_package(model), tmp_path / "pkg")
    res = run(built / EXECUTABLES[model], "--package", pkg, "--verify")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr
    assert f"| golden | {graph}[" in res.stdout and "| FAIL |" in res.stdout
    assert "| manifest | manifest.json | PASS |" in res.stdout  # only the golden vectors could tell


@pytest.mark.slow
@pytest.mark.parametrize("model, extra", [("qwen3-asr", ["--audio", "x.wav"]), ("seedvr2", ["--input", "x.png"])])
def test_verify_flag_is_refused_beside_a_run_option_and_without_a_package(built, model, extra, tmp_path):
    exe = built / EXECUTABLES[model]
    res = run(exe, "--package", tmp_path, "--verify", *extra)
    # the executables list the flags --verify does take (qwen3-asr adds --ncnn-gemv), no run option
    assert res.returncode == 2 and "--verify takes only --package, --threads, --vulkan" in res.stderr
    first = res.stderr.splitlines()[0]
    assert "--precision" in first and "--audio" not in first and "--input" not in first
    assert run(exe, "--verify").returncode == 2
    missing = run(exe, "--package", tmp_path / "nope", "--verify")
    assert missing.returncode == 2 and "nope" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_parity_runtime_cpp_on_seedvr2_tiny(built):
    """Every e2e fixture through ncnnport-seedvr2: frames byte-identical to the Python package
    loop or within the frames gate (level difference named), and within the gate vs torch."""
    from ncnnport.drivers.cpp_parity import run_cpp_parity
    from ncnnport.models.seedvr2.port import FIXTURES
    from ncnnport.stages import prepare
    from ncnnport.targets import Target

    prep = prepare(Target("seedvr2", "tiny", None))
    summary = run_cpp_parity(prep, tiny_package("seedvr2"))
    rows = summary["e2e"]
    print(json.dumps([{k: r.get(k) for k in ("fixture", "stage", "passed", "reason")} for r in rows], indent=1))
    assert summary["gates_passed"], [r["reason"] for r in rows if not r["passed"]]
    assert all(r["runtime"] == "cpp" for r in rows)
    python_rows = [r for r in rows if r["stage"] == "frames (cpp vs python package loop)"]
    assert sorted(r["fixture"] for r in python_rows) == sorted(f.label for f in FIXTURES)
    for r in python_rows:
        assert r["reason"] == "byte-identical" or (r["image_max_abs"] <= 1 and "GCC-12" in r["reason"])
    assert not any(r["stage"] == "tokens coverage (cpp)" for r in rows)
