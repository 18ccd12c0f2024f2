"""Vulkan paths: run on a machine with a GPU, skip cleanly everywhere else (CI has none)."""

import pytest

from ncnnport.metrics import compare
from ncnnport.drivers.bench import vulkan_available
from ncnnport.runtime.options import RuntimeOptions
from ncnnport.runtime.session import NcnnError, NcnnModule

pytestmark = pytest.mark.slow


def _open(pkg, options):
    d = pkg["dir"]
    return NcnnModule(d / "toy.ncnn.param", d / "toy.ncnn.bin", pkg["record"], options)


@pytest.mark.gpu
@pytest.mark.skipif(not vulkan_available(), reason="no Vulkan GPU on this machine")
def test_vulkan_matches_cpu_and_repeats_bitwise(toy_package):
    cpu = _open(toy_package, RuntimeOptions())
    gpu = _open(toy_package, RuntimeOptions(use_vulkan=True))
    inputs = toy_package["spec"].example_inputs({"seq": 17})
    ref, got = cpu.run(inputs), gpu.run(inputs)
    assert all(compare(r, g).max_abs < 1e-4 for r, g in zip(ref, got))
    again = gpu.run(inputs)
    assert all((a == b).all() for a, b in zip(got, again))


@pytest.mark.skipif(vulkan_available(), reason="this machine has a GPU")
def test_vulkan_without_gpu_is_an_error_not_a_silent_cpu_run(toy_package):
    with pytest.raises(NcnnError, match="no GPU"):
        _open(toy_package, RuntimeOptions(use_vulkan=True))


def test_package_bench_cross_checks_backends_from_specs_alone(toy_package, tmp_path):
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
