"""Derived packages (fp16 / int8 weights) pass their own ``verify``: ``model.json`` says which
weights a package holds, golden rows are judged by the packaged policy's budget of that precision,
and the packaged e2e cases expect what the package's own loop computes (the torch reference's
values kept beside them).

Why: ``package-fp16w`` and ``package-int8w`` were judged by the fp32 gates and the fp32
reference's token ids (measured on the tiny qwen3-asr: 4 passed / 18 failed and 15 / 7), so a
package we build and publish failed our own verification on the machine that built it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ncnnport.drivers.verify import judging_mode, reference_note, verify_package
from ncnnport.package.cases import PackageCase, pin_case, read_cases, write_case
from ncnnport.package.model_json import (PackageError, read_model_json, read_package_precision, set_precision,
                                         write_model_json)
from ncnnport.runtime.options import RuntimeOptions
from tests.cpp.packages import tiny_package, tiny_precision_package
from tests.cpp.test_cpp_verify import rehash, rewrite_golden

DERIVED = ("fp16-weights", "int8-weights")


# ---------------------------------------------------------------------------------------------
# model.json's precision field (no package build)

def test_model_json_states_the_precision_and_an_old_one_reads_as_fp32(tmp_path):
    write_model_json(tmp_path, "qwen3-asr", {"dims": {}}, precision="int8-weights")
    assert read_model_json(tmp_path)["precision"] == "int8-weights"
    assert read_package_precision(tmp_path) == "int8-weights"
    doc = json.loads((tmp_path / "model.json").read_text())
    del doc["precision"]  # as written before the field existed
    (tmp_path / "model.json").write_text(json.dumps(doc))
    assert read_package_precision(tmp_path) == "fp32"
    assert read_package_precision(tmp_path / "no-model-json") == "fp32"
    set_precision(tmp_path, "fp16-weights")
    assert read_model_json(tmp_path)["precision"] == "fp16-weights"


@pytest.mark.parametrize("value", ["fp16-storage", "int8", 8])
def test_a_precision_that_names_no_package_weights_is_one_line(tmp_path, value):
    write_model_json(tmp_path, "qwen3-asr", {"dims": {}})
    doc = {**json.loads((tmp_path / "model.json").read_text()), "precision": value}
    (tmp_path / "model.json").write_text(json.dumps(doc))
    for read in (read_model_json, read_package_precision):
        with pytest.raises(PackageError) as err:
            read(tmp_path)
        assert "model.json: field 'precision' is" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="not one of fp32, fp16-weights, int8-weights"):
        write_model_json(tmp_path, "qwen3-asr", {}, precision="bf16")


def test_golden_rows_are_judged_in_the_package_precision_on_its_backend():
    assert judging_mode(RuntimeOptions(), "fp32") == "fp32"
    assert judging_mode(RuntimeOptions(), "fp16-weights") == "fp16_weights"
    assert judging_mode(RuntimeOptions(), "int8-weights") == "int8_weights"
    assert judging_mode(RuntimeOptions(use_vulkan=True), "int8-weights") == "vulkan_fp16"
    assert judging_mode(RuntimeOptions(use_vulkan=True), "fp32") == "vulkan_fp32"
    assert judging_mode(RuntimeOptions(bf16_storage=True), "fp32") == "bf16"  # flags still decide an fp32 package


def test_pinning_keeps_the_reference_and_never_replaces_an_input(tmp_path):
    write_case(tmp_path, PackageCase("c", {"in.wav": b"x", "expected.png": b"ref"},
                                     {"audio": "in.wav", "expected": "expected.png"}, {"token_ids": [[1, 2]]}))
    case = read_cases(tmp_path)[0]
    assert case.reference is None and reference_note(case) == ""
    pin_case(case, {"token_ids": [[1, 3]]}, {"expected.png": b"ours"}, "int8-weights")
    again = read_cases(tmp_path)[0]
    assert again.expected == {"token_ids": [[1, 3]]} and again.reference == {"token_ids": [[1, 2]]}
    assert (tmp_path / "cases" / "c" / "expected.png").read_bytes() == b"ours"
    assert reference_note(again) == "expected = this int8-weights package's own loop, differs from the torch reference in token_ids"
    pin_case(again, {"token_ids": [[1, 2]]}, {}, "int8-weights")  # pinned twice: the reference stays torch's
    assert read_cases(tmp_path)[0].reference == {"token_ids": [[1, 2]]}
    with pytest.raises(ValueError, match="'in.wav' is not an expected-output file name"):
        pin_case(again, {}, {"in.wav": b"y"}, "int8-weights")


# ---------------------------------------------------------------------------------------------
# the tiny qwen3-asr derived packages (built once per session in build/)

def _failed(rows) -> list[str]:
    return [f"{r.kind} {r.name}: {r.detail}" for r in rows if not r.passed]


@pytest.mark.parametrize("precision", DERIVED)
def test_derived_package_passes_its_own_verify(precision):
    pkg = tiny_precision_package("qwen3-asr", precision)
    assert read_package_precision(pkg) == precision
    rows = verify_package(pkg, RuntimeOptions())
    assert not _failed(rows), _failed(rows)
    golden = [r for r in rows if r.kind == "golden"]
    cases = [r for r in rows if r.kind == "case"]
    assert len(golden) >= 18 and len(cases) >= 2
    for case in read_cases(pkg):  # pinned to the package's loop, torch's values kept
        assert case.precision == precision and case.reference is not None
        assert set(case.reference) == set(case.expected)
    assert all(f"this {precision} package's own loop" in r.detail for r in cases)


def test_the_fp32_package_keeps_the_torch_reference_cases():
    pkg = tiny_package("qwen3-asr")
    assert read_package_precision(pkg) == "fp32"
    assert all(c.reference is None and c.precision is None for c in read_cases(pkg))


def test_a_tampered_golden_in_a_derived_package_still_fails(tmp_path):
    """The int8 budget (2 x kappa x 1.11e-2 relative, at most 0.5: Qwen3-ASR's kappa 56 reaches
    that limit) is wide enough for int8 weights, not for a wrong reference: one element moved by
    3 x max|ref| (at least 0.75 of the moved reference's absmax) fails that row and only that
    row."""
    pkg = Path(shutil.copytree(tiny_precision_package("qwen3-asr", "int8-weights"), tmp_path / "pkg"))

    def change(arrays):
        ref = arrays["case0/out0"].copy()
        ref.reshape(-1)[0] += 3 * np.abs(ref).max()
        arrays["case0/out0"] = ref

    rewrite_golden(pkg, "decode_layer0", change)
    failed = _failed(verify_package(pkg, RuntimeOptions()))
    assert len(failed) == 1 and failed[0].startswith("golden decode_layer0[") and "max_abs" in failed[0], failed


def test_without_the_field_a_derived_package_is_judged_as_fp32(tmp_path):
    """What decides is model.json: the int8 package with its field removed (a package from before
    the field) reads as fp32, and its int8 decode graphs fail the fp32 gates again."""
    pkg = Path(shutil.copytree(tiny_precision_package("qwen3-asr", "int8-weights"), tmp_path / "pkg"))
    doc = json.loads((pkg / "model.json").read_text())
    del doc["precision"]
    (pkg / "model.json").write_text(json.dumps(doc))
    rehash(pkg, "model.json")
    rows = verify_package(pkg, RuntimeOptions())
    assert "weights fp32" in next(r.detail for r in rows if r.kind == "model.json")
    assert any(r.kind == "golden" and r.name.startswith("decode_layer0") for r in rows if not r.passed)
