"""`ncnnport-cpp verify`: a package's golden vectors through the C++ runtime's ncnn::Net calls,
judged as `ncnnport verify` judges (spec gates, ncnnport.metrics), with one-line errors.

Why these tests: the C++ loop is what ships, so its verify must accept every tiny package, fail a
package whose weights changed (even with a manifest re-hashed to match) naming the graph, and
refuse what it cannot judge (truncated npz, object arrays, shapes that do not fit the spec) with
exit 2 and one line, never a crash.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.cpp.verify_table import one_line_exit_2, rows

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("NCNNPORT_CPP_EXE", ROOT / "build" / "cpp" / "ncnnport-cpp"))
MODELS = ("qwen3-asr", "youtu-vl", "seedvr2")


def run_exe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="session")
def cpp_exe(built_cpp) -> Path:
    return built_cpp(EXE, "NCNNPORT_CPP_EXE")


def copy_package(src: Path, dest: Path) -> Path:
    return Path(shutil.copytree(src, dest))


def rehash(pkg: Path, rel: str) -> None:
    """Rewrite ``rel``'s manifest entry to its current bytes: the manifest check then passes and
    only the golden vectors can tell."""
    path = pkg / "manifest.json"
    manifest = json.loads(path.read_text())
    data = (pkg / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    path.write_text(json.dumps(manifest, indent=1))


def golden_case_count(pkg: Path) -> int:
    from ncnnport.package.golden import read_golden

    return sum(len(read_golden(p)) for p in sorted((pkg / "golden").glob("*.npz")))


def rewrite_golden(pkg: Path, module: str, change) -> None:
    """Apply ``change(arrays)`` to golden/<module>.npz (a dict of its arrays) and re-hash it."""
    path = pkg / "golden" / f"{module}.npz"
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    change(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())
    rehash(pkg, f"golden/{module}.npz")


def python_verify(pkg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ncnnport.cli", "verify", str(pkg)], capture_output=True,
                          text=True, timeout=600, check=False)


# ---------------------------------------------------------------------------------------------
# tiny packages pass


@pytest.mark.parametrize("model", MODELS)
def test_tiny_package_passes_every_golden_case(cpp_exe, package, model):
    pkg = package(model)
    res = run_exe("verify", str(pkg), "--threads", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    found = rows(res.stdout)
    assert len(found) == golden_case_count(pkg)
    assert all(status == "PASS" for status, _ in found.values())
    assert "| manifest | manifest.json | PASS |" in res.stdout


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl"])
def test_derived_int8_package_is_judged_in_its_precision_as_the_python_verify(cpp_exe, model):
    """package-int8w (model.json precision int8-weights): every golden row passes under the
    packaged policy's int8_weights budget, the heading says that mode, and each row's verdict is
    the Python verify's. Before the precision field both judged it by the fp32 gates and failed.
    Youtu-VL's holds its vision segments' Gemms in int8 (many rows: the executable's int8 Gemm
    hands them to ncnn's)."""
    from tests.cpp.packages import tiny_precision_package

    pkg = tiny_precision_package(model, "int8-weights")
    cpp, py = run_exe("verify", str(pkg)), python_verify(pkg)
    assert cpp.returncode == 0 and py.returncode == 0, cpp.stdout + cpp.stderr + py.stdout + py.stderr
    assert "judged as int8_weights; CPU)" in cpp.stdout.splitlines()[0]
    assert "judged as int8_weights; CPU)" in py.stdout.splitlines()[0]
    cpp_rows, py_rows = rows(cpp.stdout), rows(py.stdout)
    assert len(cpp_rows) == golden_case_count(pkg)
    assert {k: v[0] for k, v in cpp_rows.items()} == {k: v[0] for k, v in py_rows.items()}


def test_bad_precision_field_is_exit_2_naming_the_field(cpp_exe, package, tmp_path):
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    doc = json.loads((pkg / "model.json").read_text())
    (pkg / "model.json").write_text(json.dumps({**doc, "precision": "fp16-storage"}))
    rehash(pkg, "model.json")
    res = run_exe("verify", str(pkg))
    assert res.returncode == 2
    assert res.stderr.strip().endswith("model.json: field 'precision' is \"fp16-storage\", not one of fp32, "
                                       "fp16-weights, int8-weights") and res.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------------------
# judged as the Python verify judges


def test_rows_equal_the_python_verify_on_a_bit_exact_graph_with_changed_references(cpp_exe, package, tmp_path):
    """embed is bit-exact in ncnn (a table lookup), so both verifies see the same ncnn output and
    any difference in the row text is a difference in the metrics, the gates or their wording."""
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")

    def change(arrays):
        ref = arrays["case0/out0"].copy()
        ref[0, 0, :] *= 0.5                          # a row far off: cosine, worst row, max_abs
        arrays["case0/out0"] = ref
        ref1 = arrays["case1/out0"].copy()
        ref1.reshape(-1)[3] += 1e-7 * np.abs(ref1).max()  # within every gate: passes, detail has the number
        arrays["case1/out0"] = ref1

    rewrite_golden(pkg, "embed", change)
    cpp, py = run_exe("verify", str(pkg)), python_verify(pkg)
    assert cpp.returncode == 1 and py.returncode == 1, cpp.stdout + cpp.stderr + py.stdout + py.stderr
    cpp_rows, py_rows = rows(cpp.stdout), rows(py.stdout)
    embed = sorted(k for k in cpp_rows if k.startswith("embed["))
    assert len(embed) == 2
    assert {k: cpp_rows[k] for k in embed} == {k: py_rows[k] for k in embed}
    assert sorted(cpp_rows[k][0] for k in embed) == ["FAIL", "PASS"]  # case0 fails, case1 passes


def test_gates_are_the_spec_gates(cpp_exe, package, tmp_path):
    """A graph's own tolerances decide (per output name before "*"): an impossible gate on one
    output of lm_head fails that row only, naming the output."""
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    spec_path = pkg / "specs" / "lm_head.spec.json"
    spec = json.loads(spec_path.read_text())
    out = spec["outputs"][0]["name"]
    spec["tolerances"][out] = {"min_cosine": 1.0, "max_abs_rel": 0.0, "max_abs_floor": 0.0}
    spec_path.write_text(json.dumps(spec))
    rehash(pkg, "specs/lm_head.spec.json")
    res = run_exe("verify", str(pkg))
    assert res.returncode == 1
    failed = {k: v for k, v in rows(res.stdout).items() if v[0] == "FAIL"}
    assert list(failed) == ["lm_head[0]"]
    assert failed["lm_head[0]"][1].startswith(f"{out}: ") and "max_abs" in failed["lm_head[0]"][1]


# ---------------------------------------------------------------------------------------------
# a changed package fails, naming what changed


def test_perturbed_weight_fails_naming_the_module(cpp_exe, package, tmp_path):
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    rel = "ncnn/lm_head.ncnn.bin"
    data = bytearray((pkg / rel).read_bytes())
    at = (len(data) // 2) & ~3
    (value,) = struct.unpack_from("<f", data, at)
    struct.pack_into("<f", data, at, value + 8.0)  # one weight of the head's matrix
    (pkg / rel).write_bytes(bytes(data))
    rehash(pkg, rel)
    res = run_exe("verify", str(pkg))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "| manifest | manifest.json | PASS |" in res.stdout
    failed = [k for k, v in rows(res.stdout).items() if v[0] == "FAIL"]
    assert failed == ["lm_head[0]"]


def test_manifest_mismatch_runs_nothing(cpp_exe, package, tmp_path):
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    (pkg / "ncnn" / "embed.ncnn.bin").write_bytes(b"\0" * 16)
    res = run_exe("verify", str(pkg))
    assert res.returncode == 1
    assert "ncnn/embed.ncnn.bin" in res.stdout and rows(res.stdout) == {}


# ---------------------------------------------------------------------------------------------
# a package that cannot be judged: exit 2, one line


def test_truncated_npz_is_exit_2(cpp_exe, package, tmp_path):
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    path = pkg / "golden" / "embed.npz"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    rehash(pkg, "golden/embed.npz")
    one_line_exit_2(run_exe("verify", str(pkg)), str(path))


def npy_bytes(header: str, payload: bytes) -> bytes:
    """A version 1.0 .npy file with ``header`` as its dict literal (padded as numpy pads)."""
    head = header.encode("latin1")
    pad = 64 - (10 + len(head) + 1) % 64
    head += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + payload


@pytest.mark.parametrize("header, payload, expected", [
    ("{'descr': '|O', 'fortran_order': False, 'shape': (1, 7), }", b"\x80\x04N." * 7, "object array refused"),
    ("{'descr': '>i4', 'fortran_order': False, 'shape': (1, 7), }", b"\0" * 28, "dtype '>i4' not supported"),
    ("{'descr': '<i4', 'fortran_order': True, 'shape': (1, 7), }", b"\0" * 28, "Fortran-order"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 7), 'x': 1, }", b"\0" * 28, "unexpected key 'x'"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 7), }", b"\0" * 27, "truncated or padded"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (1, 7)", b"\0" * 28, "bad .npy header"),
])
def test_npy_members_are_parsed_strictly(cpp_exe, package, tmp_path, header, payload, expected):
    """Only numpy's own header subset, little-endian numeric/bool/str dtypes, C order, exact
    sizes; an object array (which numpy would unpickle) is refused."""
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    path = pkg / "golden" / "embed.npz"
    with zipfile.ZipFile(path) as src:
        members = {n: src.read(n) for n in src.namelist()}
    members["case0/in0.npy"] = npy_bytes(header, payload)
    with zipfile.ZipFile(path, "w") as dst:
        for name, data in members.items():
            dst.writestr(name, data)
    rehash(pkg, "golden/embed.npz")
    one_line_exit_2(run_exe("verify", str(pkg)), str(path), "case0/in0", expected)


@pytest.mark.parametrize("change, expected", [
    (lambda a: a.__setitem__("case0/in0", a["case0/in0"][0]), "module embed, input ids: got rank 1"),
    (lambda a: a.__setitem__("case0/in0", a["case0/in0"].astype(np.float32)), "module embed, input ids: got dtype float32, spec int32"),
])
def test_input_that_does_not_fit_the_spec_names_module_and_blob(cpp_exe, package, tmp_path, change, expected):
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    spec = json.loads((pkg / "specs" / "embed.spec.json").read_text())
    assert spec["inputs"][0]["name"] == "ids"  # the name the expectations use
    rewrite_golden(pkg, "embed", change)
    one_line_exit_2(run_exe("verify", str(pkg)), expected)


def test_axis_sizes_must_agree_across_inputs(cpp_exe, package, tmp_path):
    pkg = copy_package(package("qwen3-asr"), tmp_path / "pkg")
    rewrite_golden(pkg, "decode_layer0", lambda a: a.__setitem__("case0/in4", a["case0/in4"][:, :, :-1]))
    one_line_exit_2(run_exe("verify", str(pkg)), "module decode_layer0, input past_v: axis 'past'")


@pytest.mark.parametrize("args", [["verify"], ["verify", "PKG", "--threads", "0"], ["verify", "PKG", "--bogus"]])
def test_usage_errors_exit_2(cpp_exe, package, args):
    res = run_exe(*[str(package("qwen3-asr")) if a == "PKG" else a for a in args])
    assert res.returncode == 2 and "ncnnport-cpp verify PACKAGE [--threads N] [--vulkan]" in res.stderr


def test_vulkan_without_a_vulkan_build_is_one_line(cpp_exe, package):
    res = run_exe("verify", str(package("qwen3-asr")), "--vulkan")
    if "this build has no Vulkan" not in res.stderr:
        pytest.skip("a Vulkan build")
    one_line_exit_2(res, "--vulkan")


def test_missing_folder_is_one_line(cpp_exe, tmp_path):
    one_line_exit_2(run_exe("verify", str(tmp_path / "nope")), str(tmp_path / "nope"))
