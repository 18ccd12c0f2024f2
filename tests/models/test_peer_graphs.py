"""Each model's ONNX Runtime peer graphs (``peer_graphs`` in its bench module) are valid sizes
of its own specs, export, and compute what the torch wrapper computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.drivers.onnx_peer import NO_GRAPHS, peer_call
from ncnnport.registry import get_port

CASES = [("qwen3-asr", "decode", "16", "audio_encoder"), ("qwen3-asr", "token", "16", None),
         ("youtu-vl", "layers", "16", "decode")]


def _peer(model: str, stage: str, size: str, tmp_path):
    port = get_port(model)
    loaded = port.load("tiny", None, layers=1)
    specs = {s.name: s for s in port.module_specs(loaded)}
    graphs = port.bench_peer_graphs(loaded, stage, size)
    return port, loaded, specs, graphs, peer_call(specs, graphs, threads=1, workdir=tmp_path)


@pytest.mark.parametrize("model, stage, size, undeclared", CASES)
def test_peer_graphs_run_in_onnx_runtime_like_the_wrappers(model, stage, size, undeclared, tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    port, loaded, specs, graphs, (call, note) = _peer(model, stage, size, tmp_path)
    assert note == "" and call is not None
    outs = call()
    assert len(outs) == len(graphs)
    name, sizes = graphs[-1]
    inputs = specs[name].example_inputs(sizes)          # the peer's inputs: the spec's, seed 0
    with torch.no_grad():
        want = specs[name].build()(*(torch.from_numpy(x) for x in inputs))
    want = (want[0] if isinstance(want, (tuple, list)) else want).numpy()
    np.testing.assert_allclose(outs[-1], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    if undeclared:
        assert peer_call(specs, port.bench_peer_graphs(loaded, undeclared, size), 1, tmp_path) == (None, NO_GRAPHS)


def test_a_layer_the_exporter_refuses_is_named_in_the_cell(tmp_path, monkeypatch) -> None:
    """A graph torch's ONNX exporter refuses (as it refused Youtu-VL's grouped SDPA before the
    layer graph wrote its attention out) leaves the cell empty with the graph and the reason."""
    pytest.importorskip("onnxruntime")

    def refuse(*args, **kwargs):
        raise RuntimeError("Exporting the operator 'aten::scaled_dot_product_attention' with enable_gqa")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    *_, (call, note) = _peer("youtu-vl", "layers", "16", tmp_path)
    assert call is None and note.startswith("torch.onnx.export of llm_layer0 failed:") and "enable_gqa" in note
