"""ncnnport's copy-free MemoryData (runtime/cpp/src/memory_data_layer.cpp).

`ncnnport-memory-data-check` (runtime/cpp/tools/memory_data_check.cpp) feeds a constant to layers
that run in place (ReLU, BinaryOp with a scalar), directly and through a Split, and extracts the
constant after them, call after call, on a net with the overwrite and one without. The overwrite
hands the layer's own data on; if ncnn did not copy it before an in-place write, the constant
and the later calls would change. Slow: needs `make cpp`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("NCNNPORT_CPP_BUILD", ROOT / "build" / "cpp"))
CHECK = BUILD / "ncnnport-memory-data-check"
CALLS = 4
BLOBS = {"relu_direct", "relu_split", "add_one", "constant"}


@pytest.fixture(scope="module")
def check(built_cpp) -> Path:
    return built_cpp(CHECK, "NCNNPORT_CPP_BUILD")


def run_check(check: Path, *extra: str) -> dict:
    res = subprocess.run([str(check), "--calls", str(CALLS), *extra], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.slow
def test_in_place_consumers_never_write_the_shared_constant(check):
    out = run_check(check)
    # two MemoryData per call (c, d), each handed on without a copy
    assert out["lightmode"] and out["shares"] == 2 * CALLS, out
    for net in ("builtin", "overwrite"):
        assert len(out[net]) == CALLS
        for call in out[net]:
            assert set(call) == BLOBS and all(call.values()), (net, out[net])


@pytest.mark.slow
def test_without_lightmode_the_overwrite_copies_as_the_builtin(check):
    out = run_check(check, "--no-lightmode")
    assert out["shares"] == 0, out
    assert all(all(call.values()) for call in out["overwrite"]), out


@pytest.mark.slow
def test_check_refuses_a_bad_command_line(check):
    res = subprocess.run([str(check), "--calls", "0"], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2 and "--calls" in res.stderr
