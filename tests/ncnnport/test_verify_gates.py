"""Which gate `verify` applies: a graph's own fp32 gates on the CPU, the packaged policy's budget
for any other backend or precision, and a clear error when a package has no policy to judge by."""

from __future__ import annotations

import json
import shutil

import pytest

from ncnnport.drivers.verify import _gates, judging_mode
from ncnnport.package.model_json import PackageError
from ncnnport.registry import get_port
from ncnnport.runtime.options import RuntimeOptions

GRAPHS = ("audio_conv", "audio_encoder")
SPEC = {"tolerances": {"*": {"min_cosine": 0.999999, "max_abs_rel": 1e-4, "max_abs_floor": 1e-6}}}


def test_modes_follow_backend_and_precision() -> None:
    assert judging_mode(RuntimeOptions()) == "fp32"
    assert judging_mode(RuntimeOptions(use_vulkan=True)) == "vulkan_fp32"
    assert judging_mode(RuntimeOptions(use_vulkan=True, fp16_storage=True)) == "vulkan_fp16"
    assert judging_mode(RuntimeOptions(bf16_storage=True)) == "bf16"


def test_vulkan_rows_use_the_packaged_policy_and_fp32_rows_the_spec(tmp_path) -> None:
    shutil.copyfile(get_port("qwen3-asr").policy_path, tmp_path / "policy.json")
    assert _gates(tmp_path, "audio_conv", SPEC, "fp32", GRAPHS)("x").max_abs_rel == 1e-4
    vulkan = _gates(tmp_path, "audio_conv", SPEC, "vulkan_fp32", GRAPHS)("x")
    assert vulkan.max_abs_rel > 1e-4  # the Vulkan budget (tanh GELU, reduction order), not fp32's


def test_a_package_without_policy_cannot_judge_vulkan(tmp_path) -> None:
    with pytest.raises(PackageError, match="policy.json: missing"):
        _gates(tmp_path, "audio_conv", SPEC, "vulkan_fp32", GRAPHS)


def test_a_packaged_policy_entry_for_a_graph_the_package_lacks_is_refused(tmp_path) -> None:
    """A module entry whose name is no graph of the package would never apply: its graph would be
    judged by the mode's default in silence."""
    (tmp_path / "policy.json").write_text(json.dumps({"version": 1, "precisions": {
        "vulkan_fp32": {"modules": {"audio_conv": {"*": {"min_cosine": 0.9}}, "audio_cnov": {"*": {"min_cosine": 0.5}}}}}}))
    with pytest.raises(ValueError, match=r"policy.json: precisions.vulkan_fp32.modules.audio_cnov: not a graph"):
        _gates(tmp_path, "audio_conv", SPEC, "vulkan_fp32", GRAPHS)
    assert _gates(tmp_path, "audio_conv", SPEC, "vulkan_fp32", (*GRAPHS, "audio_cnov"))("x").min_cosine == 0.9
