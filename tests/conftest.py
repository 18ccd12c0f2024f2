"""Shared fixtures: a toy module spec converted once per session (pnnx start-up dominates)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from tests.toys import toy_spec  # noqa: E402


@pytest.fixture(scope="session")
def toy_package(tmp_path_factory) -> dict:
    """The toy spec exported and converted once: {spec, record, dir, receipt}."""
    from ncnnport.convert.pnnx_runner import convert_module
    from ncnnport.export.tracing import export_module

    out: Path = tmp_path_factory.mktemp("toy")
    spec = toy_spec()
    record = export_module(spec, out / "ts")
    receipt = convert_module(record, out / "ts" / "toy.pt", out / "ncnn")
    return {"spec": spec, "record": record, "dir": out / "ncnn", "receipt": receipt}
