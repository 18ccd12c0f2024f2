"""Running one of the layer checks (runtime/cpp/tools/*_check.cpp: an overwrite against ncnn's
built-in layer), shared by the gemv, MatMul and int8 Gemm tests."""

from __future__ import annotations

import json
import subprocess

import pytest


def run_layer_check(argv: list[str], needs: str) -> dict:
    """The check's JSON; the test is skipped where the overwrite was not registered (the CPU
    lacks ``needs``), and a non-zero exit fails it with the check's stderr."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    if not out["registered"]:
        pytest.skip(f"this CPU lacks {needs}: the overwrite is not registered")
    return out
