"""The Vulkan fallback census: which layers a Vulkan net runs on the CPU and the host syncs they cost."""

from pathlib import Path

import pytest

from ncnnport.runtime.vulkan_fallback import census, package_census, runs_on_vulkan

# x -> InnerProduct (GPU) -> Split -> MatMul (CPU, fed from the GPU: a sync) -> InnerProduct (GPU);
# cos -> ExpandDims (CPU, fed by an Input on the host: no sync) -> BinaryOp (GPU)
GRAPH = """7767517
8 10
Input            x      0 1 x
Input            cos    0 1 cos
InnerProduct     fc0    1 1 x a 0=4 1=0 2=16
Split            sp     1 2 a a1 a2
MatMul           mm     2 1 a1 a2 b 0=1
InnerProduct     fc1    1 1 b c 0=4 1=0 2=16
ExpandDims       ed     1 1 cos d -23303=1,0
BinaryOp         add    2 1 c d out 0=0
"""


def _param(tmp_path: Path, text: str = GRAPH, name: str = "g") -> Path:
    p = tmp_path / "ncnn" / f"{name}.ncnn.param"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_layer_support_is_ncnns_own():
    assert runs_on_vulkan("InnerProduct") and runs_on_vulkan("SDPA") and runs_on_vulkan("Gemm")
    assert not runs_on_vulkan("MatMul")  # ncnn 1.0.20261020 has no MatMul_vulkan
    with pytest.raises(ValueError, match="no layer type"):
        runs_on_vulkan("NoSuchLayer")


def test_a_cpu_layer_fed_from_the_gpu_costs_a_sync_one_fed_from_the_host_does_not(tmp_path):
    c = census(_param(tmp_path))
    assert c.graph == "g" and c.layers == 8
    assert dict(c.cpu_layers) == {"MatMul": 1, "ExpandDims": 1}
    assert c.syncs == 1 and not c.all_on_gpu
    assert c.describe() == "on the CPU: ExpandDims x1, MatMul x1; 1 host sync(s) per call"


def test_split_passes_its_inputs_device_on(tmp_path):
    # the same MatMul fed through a Split of a host Input: no sync
    text = "7767517\n3 4\nInput x 0 1 x\nSplit sp 1 2 x x1 x2\nMatMul mm 2 1 x1 x2 y 0=1\n"
    c = census(_param(tmp_path, text))
    assert c.cpu_layers == {"MatMul": 1} and c.syncs == 0


def test_package_census_reads_every_graph_variant(tmp_path):
    _param(tmp_path, name="a")
    _param(tmp_path, "7767517\n2 2\nInput x 0 1 x\nInnerProduct fc 1 1 x y 0=4 1=0 2=16\n", name="a.decode")
    found = {c.graph: c for c in package_census(tmp_path)}
    assert set(found) == {"a", "a.decode"} and found["a.decode"].all_on_gpu
