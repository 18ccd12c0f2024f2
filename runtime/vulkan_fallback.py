"""Which layers of a graph ncnn runs on the CPU inside a Vulkan net, and what that costs in host syncs.

Why: ncnn runs a layer type without a Vulkan implementation on the CPU even when the net runs on
Vulkan: before such a layer it downloads its GPU inputs and submits and waits for the command so
far, and the next Vulkan layer uploads the result again (ncnn net.cpp ``forward_layer``). In
1.0.20261020 MatMul, ExpandDims and Embed are such types, and the attention of both LLM decode
graphs is MatMul: every decode layer round-trips through the host, so a KV cache kept on the GPU
could not help, and the H200 ran a Qwen3-ASR decode layer slower on Vulkan than on 16 CPU
threads (issue 17 item 6). This census names the types and counts the syncs per call, so a port
can see the cost before it is timed and which layer a Vulkan-resident graph must avoid.

What is static here: a layer type's Vulkan support is a property of the ncnn build
(``ncnn.create_layer(type).support_vulkan``); no GPU is needed to take the census.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ncnnport.package.param_file import read_param

# layers that only name or fan out blobs: they move no data between devices themselves
PASS_THROUGH = {"Input", "Split"}


@lru_cache(maxsize=None)
def runs_on_vulkan(layer_type: str) -> bool:
    """Whether this ncnn build has a Vulkan implementation of ``layer_type``."""
    import ncnn

    layer = ncnn.create_layer(layer_type)
    if layer is None:
        raise ValueError(f"ncnn has no layer type {layer_type!r}")
    return bool(layer.support_vulkan)


@dataclass
class VulkanFallback:
    """One graph's census: its layers that run on the CPU in a Vulkan net, and the host syncs."""

    graph: str
    layers: int
    cpu_layers: Counter = field(default_factory=Counter)  # type -> count
    syncs: int = 0        # CPU layers fed by a Vulkan layer: one download + submit-and-wait each

    @property
    def all_on_gpu(self) -> bool:
        return not self.cpu_layers

    def describe(self) -> str:
        if self.all_on_gpu:
            return "all layers on Vulkan"
        kinds = ", ".join(f"{t} x{n}" for t, n in sorted(self.cpu_layers.items()))
        return f"on the CPU: {kinds}; {self.syncs} host sync(s) per call"

    def to_json(self) -> dict[str, Any]:
        return {"graph": self.graph, "layers": self.layers, "cpu_layers": dict(self.cpu_layers),
                "syncs_per_call": self.syncs}


def census(param: Path) -> VulkanFallback:
    """The census of one ``.ncnn.param``. A blob's device follows its producer: an Input or a
    CPU layer leaves it on the host, a Vulkan layer on the GPU (Split passes its input's on)."""
    graph = read_param(param)
    on_gpu: dict[str, bool] = {}
    result = VulkanFallback(Path(param).name.removesuffix(".ncnn.param"), len(graph.layers))
    for layer in graph.layers:
        fed_from_gpu = any(on_gpu.get(b, False) for b in layer.inputs)
        if layer.type in PASS_THROUGH:
            produced_on_gpu = fed_from_gpu
        elif runs_on_vulkan(layer.type):
            produced_on_gpu = True
        else:
            result.cpu_layers[layer.type] += 1
            result.syncs += int(fed_from_gpu)
            produced_on_gpu = False
        for b in layer.outputs:
            on_gpu[b] = produced_on_gpu
    return result


def package_census(package: Path) -> list[VulkanFallback]:
    """The census of every graph param of a package (``ncnn/*.ncnn.param``, variants included)."""
    return [census(p) for p in sorted((Path(package) / "ncnn").glob("*.ncnn.param"))]
