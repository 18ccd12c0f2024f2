"""One precision vocabulary for every command: ``run``, ``parity``, ``bench`` and the option sweep.

Why: a reduced-precision setting used to have a spelling per command (sweep variant names, a
model's own ``--precision``, a ``--fp16-decode`` flag, ``*_fp16`` bench stages), so "fp16" meant
storage+packed in one place and InnerProduct fp16 weights in another. Here each name says once
which ncnn options it sets, whether it needs the pnnx fp16-weights package, and which precision
mode of the model's policy judges it. Thread count, backend and low-memory stay the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ncnnport.runtime.options import RuntimeOptions

# the RuntimeOptions fields a precision owns (every other field is the caller's)
PRECISION_FIELDS = ("fp16_storage", "fp16_packed", "fp16_arithmetic", "bf16_storage")


@dataclass(frozen=True)
class Precision:
    """A named numeric setting: ncnn option flags, the package it runs on, the mode judging it."""

    name: str
    mode: str                                   # the policy's precision mode (parity.policy)
    flags: Mapping[str, bool] = field(default_factory=dict)
    fp16_weights: bool = False                  # the pnnx fp16-weights package (package-fp16w)
    why: str = ""
    int8_weights: bool = False                  # the int8 matrix-vector package (package-int8w)
    # Decoder K/V cache rows rounded to fp16 on write (CPU runs only). Why: at P=1000 a Qwen3-ASR
    # token reads 33 MB of fp32 cache beside 437 MB of fp16 weights (219 MB int8), 8-15 % of its
    # bytes; the C++ loop stores such rows in 2 bytes and its attention kernel widens them on load.
    # The numbers are fp16's, so the Python loop rounds the same rows (kept in fp32) and both loops
    # compute the same model. Not on Vulkan, whose GPU cache is float32. Read by Qwen3-ASR's
    # decoder; Youtu-VL's MLA latent cache stays fp32 (its C++ many-row kernels read fp32).
    fp16_kv_cache: bool = False

    def options(self, base: RuntimeOptions = RuntimeOptions()) -> RuntimeOptions:
        """``base`` with exactly this precision's flags (the others reset, threads/backend kept)
        and its K/V cache rows (fp16 only on the CPU)."""
        return base.with_(**{k: bool(self.flags.get(k, False)) for k in PRECISION_FIELDS},
                          fp16_kv_cache=self.fp16_kv_cache and not base.use_vulkan)

    @property
    def package_name(self) -> str:
        """The build folder this precision's graphs live in, beside the fp32 ``package``."""
        return "package-fp16w" if self.fp16_weights else "package-int8w" if self.int8_weights else "package"

    @property
    def inner_product_weight_bytes(self) -> int:
        """Bytes per weight an ncnn InnerProduct reads per call on x86: 1 for the int8 package's
        matrix-vector projections (plus one fp32 scale per 128 weights, 3 % more, not counted),
        2 under ``use_fp16_storage`` (the layer converts its weights to fp16 at load) and under
        ``use_bf16_storage`` (InnerProduct and Gemm convert their constant weights to bf16 at load,
        ncnn 1.0.20261020 innerproduct_x86 / gemm_x86 ``create_pipeline_bf16s``, on every x86 CPU),
        else 4 (a pnnx fp16-weights package is widened to fp32 when loaded). For the bandwidth
        bound: a bf16 run counted at 4 bytes would read as faster than the memory allows."""
        if self.int8_weights:
            return 1
        return 2 if self.flags.get("fp16_storage") or self.flags.get("bf16_storage") else 4

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "flags": dict(self.flags),
                "fp16_weights": self.fp16_weights, "int8_weights": self.int8_weights,
                "fp16_kv_cache": self.fp16_kv_cache}


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "fp32", why="the parity baseline: fp32 storage and arithmetic"),
    Precision("fp16-storage", "fp16", {"fp16_storage": True}, fp16_kv_cache=True,
              why="fp16 blobs and, for InnerProduct on x86, fp16 weights; fp16 K/V cache rows; arithmetic fp32"),
    Precision("fp16-packed", "fp16", {"fp16_storage": True, "fp16_packed": True}, fp16_kv_cache=True,
              why="fp16 storage in packed layouts; fp16 K/V cache rows; arithmetic fp32"),
    Precision("fp16-arithmetic", "fp16_arithmetic",
              {"fp16_storage": True, "fp16_packed": True, "fp16_arithmetic": True}, fp16_kv_cache=True,
              why="fp16 storage and arithmetic where ncnn has fp16 kernels; fp16 K/V cache rows"),
    Precision("bf16", "bf16", {"bf16_storage": True}, why="bf16 storage; arithmetic fp32"),
    Precision("fp16-weights", "fp16_weights", fp16_weights=True,
              why="pnnx stores the weights in fp16 (package-fp16w); ncnn runs fp32"),
    Precision("int8-weights", "int8_weights", int8_weights=True, fp16_kv_cache=True,
              why="matrix-vector InnerProducts as ncnn's weight-quantized int8 Gemm (package-int8w): "
                  "int8 weights per row and 128-block, inputs quantized per call; fp16 K/V cache rows; "
                  "the rest fp32"),
)}
NAMES = tuple(PRECISIONS)


def fp16_kv_rows(options: RuntimeOptions, package_precision: str = "fp32") -> bool:
    """Whether a decoder run with ``options`` over a package whose model.json says
    ``package_precision`` keeps its K/V rows in fp16: the options' ``fp16_kv_cache``, or a package
    whose weights' precision has it (an int8-weights package run by name, as ``verify`` and the
    pinned cases run it), never on Vulkan. The C++ twin is ``ncnnport::fp16_kv_rows``."""
    if options.use_vulkan:
        return False
    return options.fp16_kv_cache or get(package_precision).fp16_kv_cache


def judging_mode(p: Precision, use_vulkan: bool) -> str:
    """The policy mode that judges ``p`` on a backend: Vulkan has budgets of its own (another
    reduction order, and ncnn's Vulkan GELU is always the tanh form), fp32 and reduced alike."""
    if not use_vulkan:
        return p.mode
    return "vulkan_fp32" if p.mode == "fp32" else "vulkan_fp16"


def get(name: str) -> Precision:
    """The precision called ``name``; a one-line ValueError listing the vocabulary otherwise."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"--precision {name!r}: use one of {', '.join(NAMES)}") from None


def of_options(options: RuntimeOptions) -> Precision:
    """The vocabulary entry whose flags ``options`` carries (a package's fp16 or int8 weights are
    not visible in options: such a run reads as its ncnn flags, i.e. ``fp32``)."""
    for p in PRECISIONS.values():
        if not p.fp16_weights and not p.int8_weights and p.options(options).with_(
                fp16_kv_cache=options.fp16_kv_cache) == options:
            return p
    flags = {k: getattr(options, k) for k in PRECISION_FIELDS if getattr(options, k)}
    raise ValueError(f"runtime options {flags} name no precision of {', '.join(NAMES)}")
