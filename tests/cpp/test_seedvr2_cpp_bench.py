"""SeedVR2's ``bench-cpp`` workload (models/seedvr2/cpp_bench.py), without a package or an
executable: the torch reference is built only when a torch call runs (``--no-torch`` at real
widths must not materialise GBs of weights), and the Python/torch calls record per-stage seconds
under the executable's JSON names and the peak RSS of the call.
"""

from __future__ import annotations

import re
import time
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
    text = torch.zeros(2, TINY.dit.txt_in_dim)

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
    # host steps add to seconds["name"] directly; graph stages through StageClock::stop("name")
    cpp_names = {a or b for a, b in re.findall(r'seconds\["(\w+)"\]|\.stop\("(\w+)"\)', src)}
    assert set(cpp_bench.StageTimer.NAMES.values()) <= cpp_names


def test_measured_returns_the_stage_seconds_with_the_run():
    """The stages travel in the ImageRun, where the driver tabulates them beside the C++'s."""
    def restore(backend):
        backend.encode(np.zeros(4))
        return types.SimpleNamespace(frames=np.zeros((1, 2, 2, 3), np.uint8))

    run = cpp_bench.measured("python", FakeBackend(), restore)
    assert isinstance(run, ImageRun) and run.runtime == "python" and run.seconds >= 0
    assert set(run.stages) == {"vae_encode"} and run.stages["vae_encode"] <= run.seconds


class SyncedBackend(FakeBackend):
    """A device backend: work is queued until ``synchronize``, which takes the time."""

    def __init__(self) -> None:
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1
        time.sleep(0.02)


def test_stage_timer_synchronises_a_device_backend_before_its_clock_stops():
    backend = SyncedBackend()
    timer = cpp_bench.StageTimer(backend)
    timer.encode(1), timer.dit(2, 0, 1.0, {}), timer.decode(3)
    assert backend.syncs == 3 and all(v >= 0.02 for v in timer.seconds.values()), timer.seconds


# --- --torch-device: TorchBackend on a device (the meta device checks placement without a GPU) ---

def _inputs(model: Any, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 1, size, size)).astype(np.float32)
    cond = rng.standard_normal((1, size // 8, size // 8, 33)).astype(np.float32)
    return x, cond


def test_torch_backend_moves_the_reference_and_its_inputs_to_the_device():
    """Every tensor of the whole DiT and VAE follows the modules onto the device (the DiT built
    its timestep sinusoid, window indices and RoPE tables on the CPU, which a CUDA run cannot
    mix with device weights; the meta device refuses the mix as CUDA does)."""
    from ncnnport.models.seedvr2.model import build
    from ncnnport.models.seedvr2.pipeline import TorchBackend

    m = build(TINY)
    b = TorchBackend(m.dit, m.vae, "meta")
    assert {p.device.type for p in [*m.dit.parameters(), *m.vae.parameters()]} == {"meta"}
    x, cond = _inputs(m)
    with torch.inference_mode():
        out = b.dit_model.forward_stages(b._in(cond), b._in(m.text.numpy()), 1000.0)
        moments = b.vae.encode_moments(b._in(x))
        frames = b.vae.decode(moments[0])
    assert out["velocity"].device.type == "meta" and out["velocity"].shape[-1] == TINY.dit.vid_out_channels
    assert moments[0].device.type == frames.device.type == "meta"


def test_torch_backend_on_the_cpu_gives_the_modules_own_bytes():
    """``device="cpu"`` keeps the parity reference: numpy views of the modules' own outputs."""
    from ncnnport.models.seedvr2.model import build
    from ncnnport.models.seedvr2.pipeline import TorchBackend

    m = build(TINY)
    b = TorchBackend(m.dit, m.vae, "cpu")
    x, cond = _inputs(m)
    stages: dict[str, np.ndarray] = {}
    velocity = b.dit(cond, m.text.numpy(), 1000.0, stages)
    with torch.inference_mode():
        want = m.dit.forward_stages(torch.from_numpy(cond), m.text, 1000.0)
        want_m, _ = m.vae.encode_moments(torch.from_numpy(x))
    assert velocity.tobytes() == want["velocity"].numpy().tobytes() and set(stages) == set(want)
    assert b.encode(x)[0].tobytes() == want_m.numpy().tobytes()


def test_the_bench_torch_loop_runs_on_the_context_device(fake_package, monkeypatch):
    """``--torch-device``: the port's bench builds its torch backend on ``ctx.torch_device``, at
    the first torch call (not before: ``--no-torch`` never builds it)."""
    from ncnnport.models.seedvr2 import pipeline

    seen: list[Any] = []
    monkeypatch.setattr(pipeline, "restore", lambda cfg, backend, *a, **k: seen.append(backend.device)
                        or types.SimpleNamespace(frames=np.zeros((1, 2, 2, 3), np.uint8)))
    fake_package.torch_device = "meta"
    (case,) = list(SeedVR2Port().cpp_bench_cases(fake_package, [32], 16))
    assert fake_package.loaded.reference.materialised == []
    run = case.torch()
    assert seen == [torch.device("meta")] and run.runtime == "torch"
