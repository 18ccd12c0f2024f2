"""ncnn runtime options as a plain value: each session builds its own ncnn.Option from it.

Sessions never share an Option object (a leaked option between an LLM and an encoder session is
the class of bug the stability bench looks for), so this record is copied, never mutated.
"""

from __future__ import annotations

from dataclasses import dataclass, asdict, replace
from typing import Any


@dataclass(frozen=True)
class RuntimeOptions:
    num_threads: int = 1
    use_vulkan: bool = False
    fp16_storage: bool = False
    fp16_packed: bool = False
    fp16_arithmetic: bool = False
    bf16_storage: bool = False
    packing_layout: bool = True  # False gave wrong attention output in ncnn 20261020 (field notes)
    # graphs whose spec sets ``release_after_call`` empty their pools after every call: memory
    # bounded by the largest such graph instead of the sum, paid in re-allocation time (SeedVR2
    # VAE decode 512x512 on 1 thread: 21.5 GB / 27.6 s by default, 13.9 GB / 35-44 s with it)
    low_memory: bool = False
    # CPU nets: the loaded weights collapsed onto 2 MiB pages (runtime/huge_pages.py: the fp16
    # head read ~20 % faster on one thread, but loading takes seconds longer), opt-in
    huge_pages: bool = False
    # a decoder's host K/V cache keeps its rows rounded to fp16 (the CPU runs of the reduced
    # precisions, runtime/precision.py ``Precision.fp16_kv_cache``); not an ncnn flag: the models'
    # pipelines read it where they build their caches, the C++ loop stores such rows in 2 bytes
    fp16_kv_cache: bool = False

    @property
    def label(self) -> str:
        flags = [k for k in ("fp16_storage", "fp16_packed", "fp16_arithmetic", "bf16_storage")
                 if getattr(self, k)]
        parts = ["+".join(flags) if flags else "fp32", f"t{self.num_threads}"]
        if self.use_vulkan:
            parts.append("vulkan")
        if self.low_memory:
            parts.append("low-memory")
        return "/".join(parts)

    def with_(self, **changes: Any) -> "RuntimeOptions":
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def apply(self, opt: Any) -> None:
        """Write every field onto an ``ncnn.Option`` (before ``load_param``, or it has no effect)."""
        opt.num_threads = self.num_threads
        opt.use_vulkan_compute = self.use_vulkan
        opt.use_fp16_storage = self.fp16_storage
        opt.use_fp16_packed = self.fp16_packed
        opt.use_fp16_arithmetic = self.fp16_arithmetic
        opt.use_bf16_storage = self.bf16_storage
        opt.use_packing_layout = self.packing_layout


FP32 = RuntimeOptions()
