"""The C++ loops' greedy choice (greedy.cpp, `ncnnport-cpp argmax`) is numpy.argmax's: the first
index of the largest logit, +0 and -0 tied, the first NaN winning. The C++ and Python loops'
token ids are compared byte for byte, so a different tie rule would part them on a tied row."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.cpp.make_targets import ROOT

EXE = ROOT / "build" / "cpp" / "ncnnport-cpp"


def rows() -> list[np.ndarray]:
    """Rows around the 16-lane scan's edges (lengths 1-33), the head's 151936 logits, ties of the
    maximum early and late, every value -inf, signed zeros, NaNs first, in the middle and last,
    infinities, and many rows drawn from a few values (ties everywhere)."""
    rng = np.random.default_rng(7)
    out = [rng.standard_normal(n).astype(np.float32) for n in (1, 2, 15, 16, 17, 31, 32, 33, 151936)]
    tied = rng.standard_normal(1000).astype(np.float32)
    tied[[5, 600]] = 9.0
    out.append(tied)
    late = rng.standard_normal(151936).astype(np.float32)
    late[[151930, 151935]] = 50.0
    out.append(late)
    out.append(np.full(40, -np.inf, np.float32))
    zeros = np.full(40, -1.0, np.float32)
    zeros[7], zeros[9] = -0.0, 0.0
    out.append(zeros)
    for where in ([50, 70], [0], [99]):
        nan = rng.standard_normal(100).astype(np.float32)
        nan[where] = np.nan
        out.append(nan)
    inf = rng.standard_normal(50).astype(np.float32)
    inf[[3, 40]] = np.inf
    out.append(inf)
    out += [rng.choice(np.array([-1.0, 0.0, 2.0, 2.0], np.float32), size=int(n)) for n in rng.integers(1, 300, 40)]
    return out


def argmax(exe: Path, row: np.ndarray, path: Path) -> int:
    row.tofile(path)
    res = subprocess.run([str(exe), "argmax", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


@pytest.mark.slow
def test_greedy_is_numpys_argmax(built_cpp, tmp_path):
    exe = built_cpp(EXE, "NCNNPORT_CPP_EXE")
    for i, row in enumerate(rows()):
        assert argmax(exe, row, tmp_path / "row.f32") == int(np.argmax(row)), (i, row.size)


@pytest.mark.slow
def test_argmax_refuses_an_empty_row_and_a_partial_value(built_cpp, tmp_path):
    exe = built_cpp(EXE, "NCNNPORT_CPP_EXE")
    for data in (b"", b"\x00\x00\x80"):
        (tmp_path / "bad.f32").write_bytes(data)
        res = subprocess.run([str(exe), "argmax", str(tmp_path / "bad.f32")], capture_output=True, text=True, timeout=60)
        assert res.returncode != 0 and res.stderr.strip(), (data, res)
