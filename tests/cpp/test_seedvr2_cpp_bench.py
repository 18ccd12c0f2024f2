"""SeedVR2's ``bench-cpp`` workload (models/seedvr2/cpp_bench.py), without a package or an
executable: the torch reference is built only when a torch call runs (``--no-torch`` at real
widths must not materialise GBs of weights), and the Python/torch calls record per-stage seconds
under the executable's JSON names and the peak RSS of the call.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ncnnport.models.bench_kit import BenchContext, ImageRun
from ncnnport.models.seedvr2 import cpp_bench, packaged
from ncnnport.models.seedvr2.config import TINY
from ncnnport.models.seedvr2.port import SeedVR2Port

ROOT = Path(__file__).resolve().parents[2]


class CountingReference:
    """A stand-in for ``LazySeedVR2``: counts how often the whole DiT or VAE is asked for."""

    config = TINY

    def __init__(self) -> None:
        self.materialised: list[str] = []

    @property
    def dit(self) -> torch.nn.Module:
        self.materialised.append("dit")
        return torch.nn.Identity()

    @property
    def vae(self) -> torch.nn.Module:
        self.materialised.append("vae")
        return torch.nn.Identity()


@pytest.fixture
def fake_package(monkeypatch, tmp_path) -> BenchContext:
    """A context whose package opening is stubbed: the tiny config, no graphs."""
    rt = packaged.PackagedSeedVR2(TINY, np.zeros((2, TINY.dit.txt_in_dim), np.float32), None)
    monkeypatch.setattr(packaged, "open_packaged", lambda package, model_json: rt)
    monkeypatch.setattr(cpp_bench, "read_json", lambda path: {})
    monkeypatch.setattr(cpp_bench, "ncnn_modules", lambda ctx: {})
    loaded = types.SimpleNamespace(reference=CountingReference())
    return BenchContext(loaded, tmp_path / "package", tmp_path, threads=1)


def test_no_torch_call_never_materialises_the_reference(fake_package):
    port = SeedVR2Port()
    (case,) = list(port.cpp_bench_cases(fake_package, [32], 16))
    assert fake_package.loaded.reference.materialised == []  # the old code built both here
    assert case.torch is not None and case.label == "32x32"


def test_the_torch_backend_is_built_once_on_first_use(fake_package):
    bench = cpp_bench.SeedVR2Bench(fake_package, lambda: SeedVR2Port.torch_backend(fake_package.loaded),
                                   lambda cfg, modules, trig=None: (object(), None))
    first = bench.torch_backend()
    assert bench.torch_backend() is first
    assert fake_package.loaded.reference.materialised == ["dit", "vae"]


class FakeBackend:
    host_dtype = "bf16"

    def encode(self, x):
        return x, x

    def dit(self, cond, txt, t, stages):
        stages["seen"] = cond
        return cond

    def decode(self, z):
        return z


def test_stage_timer_forwards_calls_and_attributes():
    timer = cpp_bench.StageTimer(FakeBackend())
    stages: dict[str, Any] = {}
    assert timer.encode(1) == (1, 1) and timer.dit(2, 0, 1.0, stages) == 2 and timer.decode(3) == 3
    assert stages == {"seen": 2} and timer.host_dtype == "bf16"
    assert set(timer.seconds) == {"vae_encode", "dit", "vae_decode"}
    assert all(s >= 0 for s in timer.seconds.values())


def test_stage_names_are_the_executables_json_names():
    """The per-stage split compares like with like only if both runtimes name stages alike."""
    src = (ROOT / "runtime" / "cpp" / "src" / "seedvr2_pipeline.cpp").read_text(encoding="utf-8")
    cpp_names = set(re.findall(r'seconds\["(\w+)"\]', src))
    assert set(cpp_bench.StageTimer.NAMES.values()) <= cpp_names


def test_measured_records_stages_per_runtime():
    info: dict[str, Any] = {}

    def restore(backend):
        backend.encode(np.zeros(4))
        return types.SimpleNamespace(frames=np.zeros((1, 2, 2, 3), np.uint8))

    for _ in range(2):
        run = cpp_bench.measured("python", info, FakeBackend(), restore)
        assert isinstance(run, ImageRun) and run.runtime == "python" and run.seconds >= 0
    assert [set(s) for s in info["stage_seconds"]["python"]] == [{"vae_encode"}] * 2
