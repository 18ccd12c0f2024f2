"""Every model's graphs on Vulkan (lavapipe in CI): per-graph parity in Vulkan fp32 and fp16,
each judged by its own Vulkan budget, and the SeedVR2 VAE finite under fp16 arithmetic."""

from __future__ import annotations

import re

import numpy as np
import pytest

from ncnnport.drivers.bench import vulkan_available
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.targets import Target

pytestmark = [pytest.mark.slow, pytest.mark.gpu,
              pytest.mark.skipif(not vulkan_available(), reason="no Vulkan device on this machine")]

VULKAN_FP32 = RuntimeOptions(use_vulkan=True)
VULKAN_FP16 = VULKAN_FP32.with_(fp16_storage=True, fp16_packed=True, fp16_arithmetic=True)


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """model -> (prepared, package), each tiny preset converted once for this module."""
    from ncnnport.stages import convert_stage, prepare

    cache: dict = {}

    def get(model: str):
        if model not in cache:
            prep = prepare(Target(model, "tiny", None, tmp_path_factory.mktemp("vk")))
            cache[model] = (prep, convert_stage(prep))
        return cache[model]
    return get


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl", "seedvr2"])
@pytest.mark.parametrize("options,precision", [(VULKAN_FP32, "vulkan_fp32"), (VULKAN_FP16, "vulkan_fp16")],
                         ids=["vulkan_fp32", "vulkan_fp16"])
def test_every_graph_passes_its_vulkan_budget(packages, model, options, precision):
    from ncnnport.drivers.parity import run_parity

    prep, pkg = packages(model)
    summary = run_parity(prep, pkg, options=options, precision=precision, skip_e2e=True)
    failed = [f"{r['name']}/{r.get('output')}: {r['reason']}" for r in summary["modules"] if not r["passed"]]
    assert not failed, failed[:3]
    assert all(r["nan"] == 0 and r["inf"] == 0 for r in summary["modules"] if "nan" in r)


def _vae_encode_output(pkg, param_text: str, tmp_path) -> np.ndarray:
    """vae_encode at 256x448 (one frame, values in [-1, 1] like frames) on Vulkan fp16."""
    from ncnnport.fsutil import read_json
    from ncnnport.runtime.session import NcnnModule

    param = tmp_path / "vae_encode.ncnn.param"
    param.write_text(param_text)
    record = read_json(pkg / "specs" / "vae_encode.spec.json")
    mod = NcnnModule(param, pkg / "ncnn" / "vae_encode.ncnn.bin", record, VULKAN_FP16)
    # saturated noise: a valid frame in [-1, 1] with the largest per-group variance a frame can have
    x = np.clip(np.random.default_rng(0).standard_normal((1, 3, 1, 256, 448)), -1, 1).astype(np.float32)
    return mod.run([x])[0]


def test_seedvr2_vae_is_finite_on_vulkan_fp16_and_needs_the_groupnorm_patch(packages, tmp_path):
    """The GroupNorm variance overflows fp16 arithmetic at 256x448: the 31=1 feature mask the
    spec's patch writes on those Reduction layers keeps the output finite; without it, NaN."""
    _, pkg = packages("seedvr2")
    text = (pkg / "ncnn" / "vae_encode.ncnn.param").read_text()
    assert len(re.findall(r"^Reduction .* 31=1$", text, flags=re.M)) >= 2
    assert np.isfinite(_vae_encode_output(pkg, text, tmp_path)).all()
    unpatched = re.sub(r" 31=1$", "", text, flags=re.M)
    assert not np.isfinite(_vae_encode_output(pkg, unpatched, tmp_path)).all()
