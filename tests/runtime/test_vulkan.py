"""Vulkan paths: run on any Vulkan device, lavapipe (software, installed by `make test`) included."""

import os
from types import SimpleNamespace

import pytest

from ncnnport.metrics import compare
from ncnnport.drivers.bench import vulkan_available
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.session import NcnnError, NcnnModule

from ncnnport.runtime import vulkan


def _info(name: str, kind: int, vendor: int, driver: int) -> SimpleNamespace:
    """A stand-in for ``ncnn.GpuInfo`` (the fields ``runtime.vulkan`` reads)."""
    return SimpleNamespace(device_name=lambda: name, type=lambda: kind, vendor_id=lambda: vendor,
                           driver_version=lambda: driver)


def test_lavapipe_is_named_software_not_gpu():
    dev = vulkan._from_info(0, _info("llvmpipe (LLVM 15.0.6, 256 bits)", 3, 0x10005, 1))
    assert dev.is_software and dev.type == "software" and dev.vendor == "Mesa"
    assert dev.label == "software Vulkan (lavapipe)" and "GPU" not in dev.label


def test_a_discrete_gpu_is_named_with_its_driver():
    dev = vulkan._from_info(0, _info("NVIDIA H200", 0, 0x10DE, (580 << 22) | (159 << 14) | (4 << 6)))
    assert not dev.is_software and dev.label == "Vulkan discrete GPU NVIDIA H200"
    assert dev.driver_version == "580.159.04" and "NVIDIA driver 580.159.04" in dev.describe()


def test_backend_label_names_the_device(monkeypatch):
    monkeypatch.setattr(vulkan, "vulkan_devices", lambda: (vulkan._from_info(0, _info("llvmpipe", 3, 0x10005, 1)),))
    assert vulkan.backend_label("vulkan") == "vulkan: software Vulkan (lavapipe)"
    assert vulkan.backend_label("cpu") == "cpu"
    monkeypatch.setattr(vulkan, "vulkan_devices", lambda: ())
    assert vulkan.backend_label("vulkan") == "vulkan (no device)"


def test_ci_has_a_vulkan_device_when_it_must():
    """.ci/run sets NCNNPORT_REQUIRE_VULKAN=1 after `make test` installed lavapipe: the Vulkan
    tests must run there, so a missing device is a failure, not a skip."""
    if os.environ.get("NCNNPORT_REQUIRE_VULKAN") != "1":
        pytest.skip("NCNNPORT_REQUIRE_VULKAN is not set (only CI requires a Vulkan device)")
    assert vulkan_available(), "CI: no Vulkan device; .ci/vulkan-driver should have installed lavapipe"


def _open(pkg, options):
    d = pkg["dir"]
    return NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", pkg["record"], options)


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not vulkan_available(), reason="no Vulkan device on this machine")
def test_vulkan_matches_cpu_and_repeats_bitwise(toy_package):
    cpu = _open(toy_package, RuntimeOptions())
    gpu = _open(toy_package, RuntimeOptions(use_vulkan=True))
    inputs = toy_package["spec"].example_inputs({"seq": 17})
    ref, got = cpu.run(inputs), gpu.run(inputs)
    assert all(compare(r, g).max_abs < 1e-4 for r, g in zip(ref, got))
    again = gpu.run(inputs)
    assert all((a == b).all() for a, b in zip(got, again))


@pytest.mark.slow
@pytest.mark.skipif(vulkan_available(), reason="this machine has a Vulkan device")
def test_vulkan_without_gpu_is_an_error_not_a_silent_cpu_run(toy_package):
    with pytest.raises(NcnnError, match="no GPU"):
        _open(toy_package, RuntimeOptions(use_vulkan=True))


@pytest.mark.slow
@pytest.mark.gpu
def test_package_bench_cross_checks_backends_from_specs_alone(toy_package, tmp_path, capsys):
    import shutil

    from ncnnport.package.manifest import write_manifest
    from ncnnport.fsutil import write_json
    from ncnnport.drivers.package_bench import bench_package

    pkg = tmp_path / "pkg"
    shutil.copytree(toy_package["dir"], pkg / "ncnn")
    write_json(pkg / "specs" / "toy.spec.json", toy_package["record"])
    write_manifest(pkg, model="toy", source="test", config_hash="-", build_key="-", commands=[])
    rows = bench_package(pkg, ["cpu", "vulkan"], runs=5, warmup=1)
    assert rows[0]["module"] == "toy" and rows[0]["identical_outputs"] and rows[0]["cosine_vs_cpu"] == 1.0
    assert len(rows) == (2 if vulkan_available() else 1)
    if vulkan_available():
        dev = vulkan.default_device()
        assert rows[1]["device"]["name"] == dev.name and rows[1]["cosine_vs_cpu"] > 0.999999
        assert rows[1]["vulkan_fallback"]["graph"] == "toy"
        assert f"vulkan: {dev.label}" in capsys.readouterr().out
