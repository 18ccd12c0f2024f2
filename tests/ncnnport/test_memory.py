"""RSS readings: psutil for the current size, VmHWM (resettable) for the peak where Linux has it."""

import subprocess
import sys

import numpy as np
import pytest

from ncnnport import memory


def test_rss_follows_a_touched_allocation_and_the_peak_stays():
    memory.release_memory()
    before = memory.rss_bytes()
    block = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, every page touched
    during = memory.rss_bytes()
    assert during - before > 48 << 20
    assert memory.peak_rss_bytes() >= during
    del block


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM reset is Linux only")
def test_peak_resets_to_the_current_size_on_linux():
    block = np.ones(64 << 20, dtype=np.uint8)
    del block
    memory.release_memory()
    assert memory.reset_peak_rss()
    assert memory.peak_rss_bytes() < memory.rss_bytes() + (32 << 20)


def test_a_child_process_is_read_by_pid_and_a_gone_one_reads_zero(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"  # the interpreter is running, not just forked
        assert memory.child_peak_rss_bytes(child.pid) > 1 << 20
        monkeypatch.setattr(memory, "_vm_hwm_bytes", lambda pid="self": None)  # a platform without /proc
        assert memory.child_peak_rss_bytes(child.pid) > 1 << 20
    finally:
        child.communicate(b"")
    assert memory.rss_bytes(child.pid) == 0
