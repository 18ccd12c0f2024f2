"""The decode-attention rewrite (explicit scores over a past K/V -> Concat + SDPA): the same
function on ncnn's CPU and Vulkan, nothing left on the CPU of a Vulkan net that the GPU feeds, and
one-line errors on graphs it does not fit."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from ncnnport.convert.rewrites import apply_rewrites
from ncnnport.package.param_file import ParamError, read_param
from ncnnport.runtime.vulkan_fallback import census
from tests.cpp.packages import tiny_package

OUTPUTS = ("h_out", "k", "v")


def _run(param, weights, inputs, vulkan: bool) -> list[np.ndarray]:
    """The graph ``param`` over ``weights`` through the project's runner (fp32 options; ncnn's
    Python Mat from numpy is not safe to feed directly: runtime/mats.py)."""
    from ncnnport.fsutil import read_json
    from ncnnport.runtime.options import RuntimeOptions
    from ncnnport.runtime.session import NcnnModule

    spec = read_json(weights.parent.parent / "specs" / "decode_layer0.spec.json")
    module = NcnnModule(param, weights, spec, RuntimeOptions(num_threads=1, use_vulkan=vulkan))
    names = [t["name"] for t in spec["inputs"]]
    batched = [np.ascontiguousarray(inputs[n][None], dtype=np.float32) for n in names]
    return [np.asarray(o) for o in module.run(batched)]


@pytest.fixture(scope="module")
def decode_graph(tmp_path_factory):
    """qwen3-asr tiny decode_layer0 and its rewritten copy (written here, over the same .bin)."""
    pkg = tiny_package("qwen3-asr")
    base = pkg / "ncnn" / "decode_layer0.ncnn.param"
    graph = read_param(base)
    (receipt,) = apply_rewrites(graph, ["decode_attention_to_sdpa"], module="decode_layer0.gpu")
    out = tmp_path_factory.mktemp("variant") / "decode_layer0.gpu.ncnn.param"
    graph.write(out)
    return {"base": base, "variant": out, "bin": pkg / "ncnn" / "decode_layer0.ncnn.bin", "receipt": receipt}


def test_the_two_past_matmuls_become_concat_and_sdpa(decode_graph):
    (change,) = decode_graph["receipt"]["changed"]
    after = change["after"]
    assert (after["past_k"], after["past_v"], after["heads"], after["groups"]) == ("past_k", "past_v", 4, 2)
    types = read_param(decode_graph["variant"]).layer_types()
    assert "MatMul" not in types and types.count("SDPA") == 1 and types.count("Concat") == 2
    # what a Vulkan run keeps on the CPU: only the RoPE tables' ExpandDims, fed by host inputs
    assert census(decode_graph["base"]).syncs == 2
    c = census(decode_graph["variant"])
    assert c.syncs == 0 and set(c.cpu_layers) == {"ExpandDims"}


@pytest.mark.parametrize("past", [1, 9, 40])
def test_the_variant_computes_what_the_graph_computes(decode_graph, past):
    from ncnnport.runtime.vulkan import default_device

    rng = np.random.default_rng(past)
    inputs = {"h": rng.standard_normal(96), "cos": rng.standard_normal((1, 24)), "sin": rng.standard_normal((1, 24)),
              "past_k": rng.standard_normal((2, past, 24)), "past_v": rng.standard_normal((2, past, 24))}
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    want = _run(decode_graph["base"], decode_graph["bin"], inputs, vulkan=False)
    for vulkan in (False, True) if default_device() is not None else (False,):
        got = _run(decode_graph["variant"], decode_graph["bin"], inputs, vulkan)
        for name, w, g in zip(OUTPUTS, want, got):
            rel = float(np.abs(w - g).max() / np.abs(w).max())
            assert rel < 1e-5, (name, vulkan, rel)


def test_swapped_current_rows_would_be_caught(decode_graph):
    """The K and V rows are told apart by structure; the swapped graph computes something else
    (so the numeric test above does judge the choice)."""
    graph = read_param(decode_graph["variant"])
    concats = [layer for layer in graph.layers if layer.type == "Concat"]
    concats[0].inputs[1], concats[1].inputs[1] = concats[1].inputs[1], concats[0].inputs[1]
    swapped = decode_graph["variant"].with_name("swapped.ncnn.param")
    graph.write(swapped)
    rng = np.random.default_rng(0)
    inputs = {"h": rng.standard_normal(96), "cos": rng.standard_normal((1, 24)), "sin": rng.standard_normal((1, 24)),
              "past_k": rng.standard_normal((2, 5, 24)), "past_v": rng.standard_normal((2, 5, 24))}
    inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
    want = _run(decode_graph["base"], decode_graph["bin"], inputs, vulkan=False)[0]
    got = _run(swapped, decode_graph["bin"], inputs, vulkan=False)[0]
    assert float(np.abs(want - got).max() / np.abs(want).max()) > 1e-3


def test_graphs_it_does_not_fit_are_one_line_errors(decode_graph, tmp_path):
    graph = read_param(decode_graph["variant"])  # already rewritten: no MatMul reads a past input
    with pytest.raises(ParamError, match="module m.gpu: rewrite decode_attention_to_sdpa needs one MatMul"):
        apply_rewrites(copy.deepcopy(graph), ["decode_attention_to_sdpa"], module="m.gpu")
    prefill = read_param(tiny_package("qwen3-asr") / "ncnn" / "prefill_layer0.ncnn.param")
    with pytest.raises(ParamError, match="decode_attention_to_sdpa"):
        apply_rewrites(prefill, ["decode_attention_to_sdpa"], module="prefill_layer0.gpu")
