"""A deployer's check on a Vulkan device: `ncnnport verify --backend vulkan` runs a package's
golden vectors and e2e cases there, judged by the packaged policy's Vulkan budgets (lavapipe in
CI). One e2e case per model runs on the device this way."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ncnnport.drivers.bench import vulkan_available
from ncnnport.targets import Target

pytestmark = [pytest.mark.slow, pytest.mark.gpu,
              pytest.mark.skipif(not vulkan_available(), reason="no Vulkan device on this machine")]


def _package(model: str, build) -> str:
    from ncnnport.stages import convert_stage, prepare

    return str(convert_stage(prepare(Target(model, "tiny", None, build))))


def _verify(pkg: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ncnnport.cli", "verify", pkg, "--backend", "vulkan"],
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("model", ["qwen3-asr", "youtu-vl"])
def test_verify_on_vulkan_passes_goldens_and_e2e_cases(model, tmp_path):
    res = _verify(_package(model, tmp_path))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "judged as vulkan_fp32" in res.stdout and "Vulkan:" in res.stdout  # the device is named
    cases = [line for line in res.stdout.splitlines() if line.startswith("| case |")]
    assert cases and all("| PASS |" in line for line in cases)
