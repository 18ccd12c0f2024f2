"""Process memory: peak RSS of this process (resettable per stage) and of child processes.

Linux only for the per-stage numbers: ``VmHWM`` in ``/proc/self/status`` is the peak resident set;
writing ``5`` to ``/proc/self/clear_refs`` resets it, so each stage can report its own peak.
Elsewhere ``resource.getrusage`` gives the lifetime peak.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    kb = _status_kb("VmRSS")
    return (kb or 0) * 1024


def peak_rss_bytes() -> int:
    """Peak resident set of this process since start or the last :func:`reset_peak_rss`."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


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
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


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
    """VmHWM of a running process (0 when it is gone or the platform has no /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


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
