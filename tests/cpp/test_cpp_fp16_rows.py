"""The C++ K/V cache rounds fp16 rows as the Python cache does: `ncnnport-cpp fp16-bits` (fp16.h,
the conversion kv_cache.cpp stores) must give numpy's ``astype(float16)`` bits for every float32,
ties, subnormals, the overflow edge and specials included, or the two loops' caches (and so their
token ids under the reduced precisions) would part."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from tests.cpp.make_targets import ROOT

EXE = ROOT / "build" / "cpp" / "ncnnport-cpp"


def edge_values() -> np.ndarray:
    """Values where a rounding rule shows: exact halves between fp16 neighbours (normal and
    subnormal, even and odd), fp16's largest and the overflow threshold 65520 either side, the
    smallest subnormal and half of it, the normal/subnormal border, zeros, infinities, NaN."""
    fp16 = np.arange(0, 0x7c00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = (fp16[:-1] + fp16[1:]) / 2  # exact ties in float32 (one more bit than fp16's mantissa)
    near = np.nextafter(mids.astype(np.float32), np.float32(np.inf))
    below = np.nextafter(mids.astype(np.float32), np.float32(0))
    special = np.array([0.0, 65504.0, 65519.996, 65520.0, 65536.0, 2.0 ** -24, 2.0 ** -25, 2.0 ** -26,
                        2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1e-30, 3.4e38, np.inf], np.float32)
    v = np.concatenate([mids.astype(np.float32), near, below, special])
    return np.concatenate([v, -v, np.array([np.nan], np.float32)])


@pytest.mark.slow
def test_fp16_rows_are_numpys_round_to_nearest_even(built_cpp, tmp_path):
    exe = built_cpp(EXE, "NCNNPORT_CPP_EXE")
    rng = np.random.default_rng(0)
    spread = (rng.standard_normal(200_000) * np.exp2(rng.uniform(-30, 18, 200_000))).astype(np.float32)
    values = np.concatenate([edge_values(), spread])
    src, dst = tmp_path / "in.f32", tmp_path / "out.f16"
    values.tofile(src)
    res = subprocess.run([str(exe), "fp16-bits", str(src), str(dst)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = np.fromfile(dst, np.uint16)
    with np.errstate(over="ignore"):
        want = values.astype(np.float16).view(np.uint16)
    nan = np.isnan(values)
    assert (got[nan] & 0x7c00 == 0x7c00).all() and (got[nan] & 0x3ff).all()  # a NaN stays a NaN
    bad = np.flatnonzero(got[~nan] != want[~nan])
    assert bad.size == 0, [(float(values[~nan][i]), hex(got[~nan][i]), hex(want[~nan][i])) for i in bad[:5]]
