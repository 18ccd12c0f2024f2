"""Back the weights a CPU ``ncnn.Net`` loaded with transparent huge pages (2 MiB).

Why: a decoded token streams every weight once, and on one thread that read is limited by
address translation as much as by DRAM. ncnn allocates weights with ``posix_memalign``, which
gets huge pages only where the system's THP setting is "always"; the common default is
"madvise", which numpy's large arrays (and so the read-bandwidth bound) do use. Measured on a
2-core AMD EPYC, one thread: the 311 MB fp16 Qwen3-ASR head read at ~22 GB/s on 4 KiB pages and at
~25-28 GB/s on huge pages (an fp16 weight stream interleaved call by call, 30 rounds: 12.6-12.9 vs
13.9-16.5 ms). After a net loads, the 2 MiB frames of private anonymous mappings of at least
``min_bytes`` whose 4 KiB pages are all resident (``/proc/self/pagemap``: nothing sparse is
filled in, so RSS does not grow) are collapsed into huge pages (``madvise(MADV_COLLAPSE)``,
Linux 6.1+), or only marked ``MADV_HUGEPAGE`` where the kernel refuses. The same rule as the C++ runtime's
``huge_pages.cpp``; Linux only, a no-op elsewhere.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25  # Linux 6.1 uapi
HUGE = 2 << 20
MIN_BYTES = 4 << 20


@dataclass
class HugePageTotals:
    """What every call in this process did: bytes collapsed, bytes only advised, first refusal."""

    collapsed_bytes: int = 0
    advised_bytes: int = 0
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"collapsed_bytes": self.collapsed_bytes, "advised_bytes": self.advised_bytes, "error": self.error,
                "anon_huge_pages_bytes": anon_huge_pages_bytes()}


TOTALS = HugePageTotals()


@dataclass(frozen=True)
class Mapping:
    begin: int
    end: int
    rss: int  # bytes resident
    huge: int  # bytes of that already on huge pages
    candidate: bool  # private, writable, anonymous (no file, or the heap)


def read_mappings(smaps: str = "/proc/self/smaps") -> list[Mapping]:
    """The process's mappings with their resident and huge-page bytes."""
    out: list[dict[str, Any]] = []
    with open(smaps, encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split(None, 5)
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                begin, end = (int(x, 16) for x in head[0].split("-"))
                path = head[5].strip() if len(head) > 5 else ""
                perms = head[1]
                out.append({"begin": begin, "end": end, "rss": 0, "huge": 0,
                            "candidate": perms.startswith("rw") and perms[3:4] == "p" and path in ("", "[heap]")})
            elif out and line.startswith("Rss:"):
                out[-1]["rss"] = int(line.split()[1]) * 1024
            elif out and line.startswith("AnonHugePages:"):
                out[-1]["huge"] = int(line.split()[1]) * 1024
    return [Mapping(**m) for m in out]


def anon_huge_pages_bytes() -> int | None:
    """AnonHugePages of this process (/proc/self/smaps_rollup), None where there is none."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _madvise() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _collapse(madvise: Any, start: int, size: int) -> bool:
    """MADV_COLLAPSE, tried again frame by frame (three times each) on EAGAIN, the kernel's
    "transient failure" (a page it could not lock or a huge page it could not allocate then)."""
    import errno

    if madvise(start, size, MADV_COLLAPSE) == 0:
        return True
    if ctypes.get_errno() != errno.EAGAIN:
        return False
    ok = all(any(madvise(frame, HUGE, MADV_COLLAPSE) == 0 for _ in range(3)) for frame in range(start, start + size, HUGE))
    if not ok:
        ctypes.set_errno(errno.EAGAIN)
    return ok


def resident_frame_runs(begin: int, end: int, pagemap: int) -> list[tuple[int, int]]:
    """[start, stop) runs of whole 2 MiB frames in [begin, end) (both frame-aligned) whose every
    4 KiB page is present (bit 63 of its /proc/self/pagemap entry)."""
    import numpy as np

    pages = (end - begin) // 4096
    raw = os.pread(pagemap, pages * 8, begin // 4096 * 8)
    present = (np.frombuffer(raw, dtype="<u8", count=len(raw) // 8) >> np.uint64(63)).astype(bool)
    if present.size < pages:
        return []
    full = present.reshape(-1, HUGE // 4096).all(axis=1)
    runs: list[tuple[int, int]] = []
    for i in np.flatnonzero(full):
        start = begin + int(i) * HUGE
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], start + HUGE)
        else:
            runs.append((start, start + HUGE))
    return runs


def back_large_mappings_with_huge_pages(min_bytes: int = MIN_BYTES) -> tuple[int, int, str | None]:
    """Collapse the fully resident 2 MiB frames of every private anonymous mapping of >=
    ``min_bytes`` into huge pages; returns (bytes newly on huge pages: the growth of the
    process's AnonHugePages over the call, bytes only advised, first error or None) and adds them
    to :data:`TOTALS`. Frames already huge are handed to the kernel again (a no-op there) and not
    counted."""
    madvise = _madvise()
    if madvise is None:
        step = (0, 0, "not Linux: no transparent huge pages")
    else:
        advised = 0
        error: str | None = None
        before = anon_huge_pages_bytes() or 0
        with open("/proc/self/pagemap", "rb", buffering=0) as pm:
            for m in read_mappings():
                begin, end = -(-m.begin // HUGE) * HUGE, m.end // HUGE * HUGE
                if not m.candidate or end - begin < max(min_bytes, HUGE) or m.huge >= end - begin:
                    continue  # small, not anonymous, or collapsed by an earlier call
                for start, stop in resident_frame_runs(begin, end, pm.fileno()):
                    if _collapse(madvise, start, stop - start):
                        continue
                    if error is None:
                        error = f"MADV_COLLAPSE: {os.strerror(ctypes.get_errno())}"
                    if madvise(start, stop - start, MADV_HUGEPAGE) == 0:
                        advised += stop - start
        step = (max(0, (anon_huge_pages_bytes() or 0) - before), advised, error)
    with TOTALS.lock:
        TOTALS.collapsed_bytes += step[0]
        TOTALS.advised_bytes += step[1]
        TOTALS.error = TOTALS.error or step[2]
    return step
