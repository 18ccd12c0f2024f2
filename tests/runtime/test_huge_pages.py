"""runtime/huge_pages.py: which mappings the huge-page step takes, and that it backs a resident
buffer of known size with huge pages (or names the refusal)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ncnnport.runtime import huge_pages as hp
from ncnnport.runtime.options import FP32

SMAPS = """\
7f0000000000-7f0000a00000 rw-p 00000000 00:00 0
Rss:               10240 kB
AnonHugePages:         0 kB
7f0001000000-7f0001a00000 r--p 00000000 08:01 42                         /usr/lib/libfoo.so
Rss:               10240 kB
AnonHugePages:         0 kB
7f0002000000-7f0002a00000 rw-s 00000000 00:01 7                          /dev/zero (deleted)
Rss:               10240 kB
AnonHugePages:         0 kB
5600000000-5600400000 rw-p 00000000 00:00 0                              [heap]
Size:               4096 kB
Rss:                4096 kB
AnonHugePages:      4096 kB
7ffc00000000-7ffc00800000 rw-p 00000000 00:00 0                          [stack]
Rss:                 132 kB
"""


def test_read_mappings_takes_private_writable_anonymous_and_the_heap(tmp_path: Path):
    path = tmp_path / "smaps"
    path.write_text(SMAPS)
    got = hp.read_mappings(str(path))
    assert [(m.begin, m.end) for m in got][0] == (0x7F0000000000, 0x7F0000A00000)
    assert [m.candidate for m in got] == [True, False, False, True, False]
    assert [m.rss for m in got] == [10 << 20, 10 << 20, 10 << 20, 4 << 20, 132 << 10]
    assert got[3].huge == 4 << 20


# Run in a fresh interpreter: in a long-lived process (pytest's) the buffer can share a mapping
# with other memory, or sit in one split by an earlier advice, so its own frames cannot be read
# off /proc/self/smaps there (CI saw the buffer in a 7 MiB mapping).
CHILD = """
import ctypes, json
from ncnnport.runtime import huge_pages as hp
size = 64 << 20
buf = bytearray(size)
buf[:] = b"\\x01" * size  # resident, as loaded weights are
address = ctypes.addressof((ctypes.c_char * size).from_buffer(buf))
first = hp.back_large_mappings_with_huge_pages()
again = hp.back_large_mappings_with_huge_pages()
huge = sum(m.huge for m in hp.read_mappings() if m.begin < address + size and address < m.end)
print(json.dumps({"first": first, "again": again, "huge_over_buffer": huge, "totals": hp.TOTALS.to_json()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_a_resident_buffer_ends_on_huge_pages_or_the_refusal_is_named():
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    (collapsed, advised, error), again = out["first"], out["again"]
    frames = (64 << 20) - 2 * hp.HUGE  # whole 2 MiB frames of the buffer: all but at most one at either end
    if error is None or collapsed >= frames:
        assert collapsed >= frames and out["huge_over_buffer"] >= frames, out
        assert again[0] < frames, out  # a second call finds the buffer collapsed: nothing new to count
    else:
        assert advised + collapsed >= frames, out
    assert out["totals"]["collapsed_bytes"] >= collapsed


def test_huge_pages_are_opt_in():
    """Off by default: the collapse costs seconds of load (see the module's docstring)."""
    assert not FP32.huge_pages and FP32.with_(huge_pages=True).huge_pages
