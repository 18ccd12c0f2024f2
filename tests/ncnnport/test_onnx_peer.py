"""The ONNX Runtime peer column: the spec's own torch wrapper exported and run at the bench's
threads, and a cell that says why whenever the peer cannot run."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from ncnnport.contract import ModuleSpec, TensorSpec
from ncnnport.drivers.onnx_peer import NO_GRAPHS, peer_call


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Unexportable(torch.nn.Module):
    """Refuses to be traced, with a multi-line message (as exporter errors come)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("op not supported here\nlong trace that must not reach the cell")


def _spec(name: str, build) -> ModuleSpec:
    return ModuleSpec(name, build=build, inputs=[TensorSpec("x", (1, "n", 8))],
                      outputs=[TensorSpec("y", (1, "n", 3))], axes={"n": (2, 5)})


def test_the_peer_runs_the_specs_wrapper_in_onnx_runtime(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    module = Affine().eval()
    spec = _spec("affine", lambda: module)
    call, note = peer_call({"affine": spec}, [("affine", {"n": 4})], threads=1, workdir=tmp_path)
    assert note == "" and call is not None
    (got,) = call()
    (x,) = spec.example_inputs({"n": 4})
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "affine-n4.onnx").is_file()


def test_a_failed_export_is_the_cells_reason(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    spec = _spec("bad", lambda: Unexportable().eval())
    call, note = peer_call({"bad": spec}, [("bad", {"n": 2})], threads=1, workdir=tmp_path)
    assert call is None and note.startswith("torch.onnx.export of bad failed:") and "\n" not in note
    assert "op not supported here" in note and "long trace" not in note


def test_no_graphs_or_no_onnxruntime_is_said(tmp_path, monkeypatch) -> None:
    assert peer_call({}, None, 1, tmp_path) == (None, NO_GRAPHS)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)   # import fails as when not installed
    call, note = peer_call({}, [("affine", {"n": 2})], 1, tmp_path)
    assert call is None and "onnxruntime not installed" in note


def test_peer_pool_threads_sleep_between_interleaved_calls() -> None:
    pytest.importorskip("onnxruntime")
    from ncnnport.drivers.onnx_peer import session_options

    opts = session_options(2)
    assert opts.intra_op_num_threads == 2 and opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
