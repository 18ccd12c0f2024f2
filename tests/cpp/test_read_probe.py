"""`ncnnport-cpp read-bandwidth` (read_probe.h): the C++ runtime's own read of the machine, plain
and with the one-row kernels' software prefetch (at their distances and at half of them), which bench-cpp adds to the bound's reads so a
prefetching kernel can never read faster than the bound's bandwidth (tests/cpp/test_cpp_bench.py
holds the bench to the fastest read)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.cpp.make_targets import ROOT

EXE = ROOT / "build" / "cpp" / "ncnnport-cpp"


def probe(exe, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), "read-bandwidth", *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_the_probe_reads_both_ways_at_the_thread_count_asked(built_cpp):
    exe = built_cpp(EXE, "NCNNPORT_CPP_EXE")
    for threads in (1, 2):
        done = probe(exe, "--mib", "64", "--runs", "3", "--threads", str(threads))
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert (out["mib"], out["runs"], out["threads"]) == (64, 3, threads)
        assert out["isa"] in ("avx512", "avx2", "scalar")
        # any machine reads 64 MiB at more than 0.1 GB/s and less than 10 TB/s
        assert all(0.1 < out[k] < 1e4 for k in ("plain_gbps", "prefetch_gbps", "prefetch_near_gbps", "streams4_gbps")), out


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--mib", "0"], ["--runs", "x"], ["--threads"], ["--bytes", "3"]])
def test_a_bad_probe_command_line_is_refused(built_cpp, args):
    done = probe(built_cpp(EXE, "NCNNPORT_CPP_EXE"), *args)
    assert done.returncode == 2 and "read-bandwidth" in done.stderr
