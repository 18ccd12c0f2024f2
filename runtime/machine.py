"""The machine a run happened on: CPU model, the ISA features ncnn dispatches on, tool versions.

Reduced-precision errors and latencies depend on which ISA path ncnn picks at run time (AVX-512
FP16/BF16, F16C, ARM asimdhp), so a summary without this record cannot be compared with another
machine's.
"""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path
from typing import Any

from ncnnport.runtime.vulkan import device_record, vulkan_text

# /proc/cpuinfo flags ncnn's x86 dispatch reads (cpu.cpp) or that change its kernels
X86_FLAGS = ("sse4_1", "avx", "f16c", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")
# /proc/cpuinfo "Features" an aarch64 ncnn dispatches on (fp16 storage/arithmetic, bf16, dot, int8 mm)
ARM_FLAGS = ("fphp", "asimdhp", "asimddp", "bf16", "i8mm", "sve", "sve2")


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model and the relevant features from the text of /proc/cpuinfo (first processor)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    if "flags" in fields:
        have = set(fields["flags"].split())
        return {"cpu_model": fields.get("model name", "unknown"),
                "isa_features": [f for f in X86_FLAGS if f in have]}
    have = set(fields.get("features", "").split())
    model = fields.get("model name") or f"implementer {fields.get('cpu implementer', '?')} " \
                                           f"part {fields.get('cpu part', '?')}"
    return {"cpu_model": model, "isa_features": [f for f in ARM_FLAGS if f in have]}


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def ncnn_dispatch() -> dict[str, bool]:
    """The CPU features as ncnn's own cpuid probe sees them (``ncnn.cpu_support_*`` that the
    Python binding exposes). Differs from /proc/cpuinfo under an emulated CPU (qemu-user shows
    the host's cpuinfo) or a hypervisor that masks features: this is what picked the kernels."""
    try:
        import ncnn
    except ImportError:
        return {}
    probes = sorted(n for n in dir(ncnn) if n.startswith("cpu_support_"))
    return {n[len("cpu_support_"):]: bool(getattr(ncnn, n)()) for n in probes}


def cpu_record(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """Architecture, CPU model, ISA features and ncnn's own probe; no Vulkan (a speed table's
    heading must not start a GPU driver)."""
    try:
        cpu = parse_cpuinfo(cpuinfo.read_text())
    except OSError:
        cpu = {"cpu_model": platform.processor() or "unknown", "isa_features": []}
    return {"arch": platform.machine(), **cpu, "ncnn_dispatch": ncnn_dispatch()}


def machine_record(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """What every summary records about the machine (unreadable cpuinfo: model "unknown")."""
    return {**cpu_record(cpuinfo), "ncnn": _version("ncnn"), "torch": _version("torch"),
            "numpy": _version("numpy"), "vulkan_device": device_record()}


def describe(record: dict[str, Any]) -> str:
    """One line for tables and logs."""
    seen = [k for k, v in record.get("ncnn_dispatch", {}).items() if v]
    return (f"{record['cpu_model']} ({record['arch']}: {' '.join(record['isa_features']) or 'baseline ISA'}; "
            f"ncnn sees: {' '.join(seen) or 'baseline ISA'}), ncnn {record['ncnn']}, torch {record['torch']}"
            f"{vulkan_text(record.get('vulkan_device'))}")


def table_heading(record: dict[str, Any], threads: int, read_gbps: float, extra: str = "") -> str:
    """The line that heads every speed table: a ratio or a % of the bound means nothing without
    the CPU, its ISA features, the thread count and the bandwidth measured in the same run."""
    return (f"machine: {record['cpu_model']} ({record['arch']}: "
            f"{' '.join(record['isa_features']) or 'baseline ISA'}); threads {threads}; "
            f"read bandwidth {read_gbps:.1f} GB/s{'; ' + extra if extra else ''}")
