"""Process memory: peak RSS of this process (resettable per stage) and of child processes.

Current RSS comes from psutil on every platform. psutil has no peak (high-water mark) on Linux
or macOS, so the peak is read where the platform keeps one: Linux ``VmHWM`` in
``/proc/<pid>/status``, which writing ``5`` to ``/proc/self/clear_refs`` resets to the current
RSS (so each stage reports its own peak); Windows ``peak_wset`` through psutil; elsewhere the
lifetime peak from ``resource.getrusage``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from pathlib import Path

import psutil


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size now of this process (or ``pid``); 0 when it is gone or unreadable."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return 0


def _vm_hwm_bytes(pid: int | str = "self") -> int | None:
    """Linux's resettable peak RSS (``VmHWM``); None where /proc does not give it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _rusage_peak_bytes(children: bool = False) -> int:
    """Lifetime peak RSS from getrusage (kB on Linux, bytes on macOS); 0 without ``resource``."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_rss_bytes() -> int:
    """Peak resident set of this process since start or the last :func:`reset_peak_rss`."""
    hwm = _vm_hwm_bytes()
    if hwm is not None:
        return hwm
    peak_wset = getattr(psutil.Process().memory_info(), "peak_wset", None)  # Windows only
    if peak_wset is not None:
        return int(peak_wset)
    return _rusage_peak_bytes()


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not supported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def children_peak_rss_bytes() -> int:
    """Largest peak RSS of any waited-for child process so far (lifetime, not resettable)."""
    return _rusage_peak_bytes(children=True)


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``), so the
    next module's peak is not inflated by the previous module's freed-but-kept pages."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.malloc_trim(0)
        except (OSError, AttributeError):
            pass


def mb(n: int) -> float:
    return round(n / 2**20, 1)


def child_peak_rss_bytes(pid: int) -> int:
    """Peak RSS so far of a running process: Linux VmHWM, elsewhere its RSS now (a caller that
    samples every few ms keeps the maximum); 0 when it is gone."""
    hwm = _vm_hwm_bytes(pid)
    return hwm if hwm is not None else rss_bytes(pid)


class PhaseMemory:
    """Peak RSS and seconds per named phase of one process (VmHWM reset at each start): the
    receipt of a streamed run that holds one module of each side at a time."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}

    def run(self, name: str, fn):
        import time

        release_memory()
        reset_peak_rss()
        t0 = time.perf_counter()
        out = fn()
        self.phases[name] = {"peak_rss_mb": mb(peak_rss_bytes()), "seconds": round(time.perf_counter() - t0, 2)}
        return out

    def peak(self) -> dict:
        name = max(self.phases, key=lambda k: self.phases[k]["peak_rss_mb"])
        return {"peak_rss_mb": self.phases[name]["peak_rss_mb"], "peak_phase": name}
