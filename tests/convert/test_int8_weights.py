"""The int8-weights rewrite on toy graphs: ncnn's weight-quantized Gemm against a numpy int8
reference of the same quantization, the .bin really int8, the .bin walk strict, and the probe
leaving multi-row InnerProducts alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import ncnn

from ncnnport.convert.int8_weights import (TAG_FP32, probe_input_dims, quantize_blocks, rewrite_graph,
                                           round_half_away, walk_bin)
from ncnnport.package.param_file import ParamError, read_param
from ncnnport.runtime.mats import to_mat
from ncnnport.runtime.options import RuntimeOptions

N, K, N2 = 40, 300, 24  # K > 128: three blocks, the last one short


def _toy(tmp: Path, rng: np.random.Generator) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """in0 -> RMSNorm(affine) -> InnerProduct(bias) -> InnerProduct(no bias) -> out0."""
    w = {"gamma": rng.standard_normal(K).astype(np.float32),
         "w1": rng.standard_normal((N, K)).astype(np.float32), "b1": rng.standard_normal(N).astype(np.float32),
         "w2": rng.standard_normal((N2, N)).astype(np.float32)}
    param = tmp / "toy.ncnn.param"
    param.write_text("7767517\n4 4\n"
                     "Input in0 0 1 in0\n"
                     f"RMSNorm norm 1 1 in0 a 0={K} 1=1.000000e-6 2=1\n"
                     f"InnerProduct fc1 1 1 a b 0={N} 1=1 2={N * K}\n"
                     f"InnerProduct fc2 1 1 b out0 0={N2} 1=0 2={N2 * N}\n")
    tag = np.uint32(TAG_FP32).tobytes()
    weights = tmp / "toy.ncnn.bin"
    weights.write_bytes(w["gamma"].tobytes() + tag + w["w1"].tobytes() + w["b1"].tobytes()
                        + tag + w["w2"].tobytes())
    return param, weights, w


def _run(param: Path, weights: Path, x: np.ndarray, packing: bool = True) -> np.ndarray:
    net = ncnn.Net()
    RuntimeOptions(num_threads=1).apply(net.opt)
    net.opt.use_packing_layout = packing
    assert net.load_param(str(param)) == 0 and net.load_model(str(weights)) == 0
    ex = net.create_extractor()
    mat, buf = to_mat(x[None], what="toy in0")  # as the runtime feeds graphs
    ex.input("in0", mat)
    rc, out = ex.extract("out0")
    assert rc == 0
    return np.array(out, dtype=np.float32)


def _int8_matvec(w: np.ndarray, x: np.ndarray, block: int) -> np.ndarray:
    """y = W x as ncnn's weight-quantized Gemm computes it: W per row and block, x per block at
    call time (absmax / 127), int32 dot products, each block rescaled."""
    q, scales = quantize_blocks(w, block)
    y = np.zeros(w.shape[0], np.float64)
    for b in range(scales.shape[1]):
        part = slice(b * block, (b + 1) * block)
        absmax = float(np.abs(x[part]).max())
        xq = np.clip(round_half_away(x[part] * np.float32(127.0 / absmax)), -127, 127)
        y += (q[:, part].astype(np.int64) @ xq.astype(np.int64)) * (absmax / 127.0) / scales[:, b]
    return y


def _reference(w: dict[str, np.ndarray], x: np.ndarray, block: int, int8: bool) -> np.ndarray:
    a = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6) * w["gamma"]
    mv = (lambda m, v: _int8_matvec(m, v.astype(np.float32), block)) if int8 else (lambda m, v: m @ v)
    b = mv(w["w1"], a) + w["b1"]
    return mv(w["w2"], b)


@pytest.mark.parametrize("block", [32, 128])
def test_rewritten_graph_matches_a_numpy_int8_reference(tmp_path, block):
    rng = np.random.default_rng(0)
    param, weights, w = _toy(tmp_path, rng)
    x = rng.standard_normal(K).astype(np.float32)
    out_p, out_b = tmp_path / "q.ncnn.param", tmp_path / "q.ncnn.bin"
    receipts = rewrite_graph(param, weights, out_p, out_b, {"fc1": 1, "fc2": 1}, block=block)
    assert [r["layer"] for r in receipts] == ["fc1", "fc2"]
    got = _run(out_p, out_b, x)  # default packing: the 1-D input would be packed without the reshapes
    assert got.shape == (N2,)  # the InnerProduct's 1-D output shape is kept
    int8_ref = _reference(w, x, block, int8=True)
    fp32_ref = _reference(w, x, block, int8=False)
    scale = np.abs(fp32_ref).max()
    assert np.abs(got - int8_ref).max() / scale < 1e-5  # ncnn computes exactly this quantization
    assert np.abs(got - fp32_ref).max() / scale > 1e-4  # and it is a quantization, not fp32
    assert np.abs(_run(param, weights, x) - fp32_ref).max() / scale < 1e-5  # the toy itself is right


def test_bin_holds_int8_weights_and_per_block_scales(tmp_path):
    param, weights, _ = _toy(tmp_path, np.random.default_rng(1))
    out_p, out_b = tmp_path / "q.ncnn.param", tmp_path / "q.ncnn.bin"
    rewrite_graph(param, weights, out_p, out_b, {"fc1": 1, "fc2": 1}, block=128)
    gamma = 4 * K
    fc1 = N * K + 4 + 4 * N + 4 * N * 3  # int8 B, flagged fp32 bias (C), scales [N][3 blocks]
    fc2 = N2 * N + 4 * N2  # K=40: one block
    assert out_b.stat().st_size == gamma + fc1 + fc2
    assert out_b.stat().st_size < 0.3 * weights.stat().st_size
    walked = walk_bin(read_param(out_p), out_b.read_bytes(), str(out_b))  # the new layout walks too
    assert [b.nbytes for b in walked["fc1"]] == [N * K, 4 * N, 12 * N]


def test_two_d_single_row_input_needs_no_reshape(tmp_path):
    param, weights, w = _toy(tmp_path, np.random.default_rng(2))
    out_p, out_b = tmp_path / "q.ncnn.param", tmp_path / "q.ncnn.bin"
    rewrite_graph(param, weights, out_p, out_b, {"fc2": 2}, block=128)
    assert [lay.type for lay in read_param(out_p).layers] == ["Input", "RMSNorm", "InnerProduct", "Gemm"]


def test_bin_walk_refuses_a_size_mismatch(tmp_path):
    param, weights, _ = _toy(tmp_path, np.random.default_rng(3))
    weights.write_bytes(weights.read_bytes() + b"\0" * 4)
    with pytest.raises(ParamError, match="toy.ncnn.bin: the param's layers read"):
        walk_bin(read_param(param), weights.read_bytes(), str(weights))


def test_bin_walk_refuses_an_unknown_weight_layer(tmp_path):
    param = tmp_path / "c.ncnn.param"
    param.write_text("7767517\n2 2\nInput in0 0 1 in0\nDeconvolution deconv 1 1 in0 out0 0=4 1=3 6=108\n")
    with pytest.raises(ParamError, match="deconv of type Deconvolution"):
        walk_bin(read_param(param), b"\0" * 436, "c.ncnn.bin")


def test_quantization_rounds_half_away_from_zero_like_ncnn():
    w = np.array([[127.0, 0.5, -0.5, 1.5]], np.float32)  # absmax 127: scale 1
    q, scales = quantize_blocks(w, 32)
    assert scales.tolist() == [[1.0]] and q.tolist() == [[127, 1, -1, 2]]  # np.rint gives 0, -0, 2


def test_probe_keeps_matrix_vector_layers_only(tmp_path):
    param, weights, _ = _toy(tmp_path, np.random.default_rng(4))
    spec = {"inputs": [{"name": "in0"}]}
    one_row = SimpleNamespace(inputs=[np.ones((1, K), np.float32)])
    assert probe_input_dims(param, weights, spec, [one_row]) == {"fc1": 1, "fc2": 1}
    rows = SimpleNamespace(inputs=[np.ones((1, 3, K), np.float32)])  # 3 rows: compute-bound, kept fp32
    assert probe_input_dims(param, weights, spec, [one_row, rows]) == {}


def test_variants_that_share_the_bin_layout_are_rewritten_with_their_graph(tmp_path):
    """Qwen3-ASR's decode layers carry a 'gpu' variant (attention rewired, weighted layers as in
    the base): the int8 package rewrites both, so both read the new .bin and compute the same
    numbers. Youtu-VL's decode variants change weighted layers' types (Gemm -> InnerProduct): they
    do not share the layout, and those graphs stay fp32."""
    from ncnnport.convert.int8_weights import int8_package, shares_layout
    from tests.cpp.packages import tiny_package

    src = tiny_package("qwen3-asr")
    out = tmp_path / "package-int8w"
    receipts = int8_package(src, out)
    assert "decode_layer0" in receipts
    for graph in ("decode_layer0", "decode_layer0.gpu"):
        types = read_param(out / "ncnn" / f"{graph}.ncnn.param").layer_types()
        assert "InnerProduct" not in types and "Gemm" in types, graph
    from ncnnport.fsutil import read_json
    from ncnnport.runtime.session import NcnnModule

    spec = read_json(out / "specs" / "decode_layer0.spec.json")
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in
              ((1, 96), (1, 1, 24), (1, 1, 24), (1, 2, 6, 24), (1, 2, 6, 24))]
    base = NcnnModule(out / "ncnn" / "decode_layer0.ncnn.param", out / "ncnn" / "decode_layer0.ncnn.bin", spec,
                      RuntimeOptions(num_threads=1))
    outs = [base.run(inputs)[0], base.variant("gpu").run(inputs)[0]]
    assert np.abs(outs[0] - outs[1]).max() <= 1e-5 * np.abs(outs[0]).max()
    fp32 = NcnnModule(src / "ncnn" / "decode_layer0.ncnn.param", src / "ncnn" / "decode_layer0.ncnn.bin", spec,
                      RuntimeOptions(num_threads=1)).run(inputs)[0]
    assert np.abs(outs[0] - fp32).max() > 1e-4 * np.abs(fp32).max()  # the int8 weights really ran
    yv = tiny_package("youtu-vl") / "ncnn"
    assert not shares_layout(yv / "llm_layer0.ncnn.param", yv / "llm_layer0.decode.ncnn.param", yv / "llm_layer0.ncnn.bin")


def _weight_gemm_toy(tmp: Path, rng: np.random.Generator, rows: int) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """in0 [rows, K] -> Gemm(constant transposed B, bias as C per column) -> out0: pnnx's layout of
    ``nn.Linear`` on a 3-D input."""
    w = {"w": rng.standard_normal((N, K)).astype(np.float32), "b": rng.standard_normal(N).astype(np.float32)}
    param = tmp / "g.ncnn.param"
    param.write_text("7767517\n2 2\n"
                     "Input in0 0 1 in0\n"
                     f"Gemm fc 1 1 in0 out0 10=4 2=0 3=1 4=0 5=1 6=1 7=0 8={N} 9={K}\n")
    tag = np.uint32(TAG_FP32).tobytes()
    weights = tmp / "g.ncnn.bin"
    weights.write_bytes(tag + w["w"].tobytes() + tag + w["b"].tobytes())
    return param, weights, w


def _run_rows(param: Path, weights: Path, x: np.ndarray) -> np.ndarray:
    net = ncnn.Net()
    RuntimeOptions(num_threads=1).apply(net.opt)
    assert net.load_param(str(param)) == 0 and net.load_model(str(weights)) == 0
    ex = net.create_extractor()
    mat, buf = to_mat(x[None], what="toy in0")  # [1, rows, K]: the runtime's 3-D layout, one channel
    ex.input("in0", mat)
    rc, out = ex.extract("out0")
    assert rc == 0
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("rows", [1, 37])
def test_weight_gemm_is_rewritten_for_any_number_of_rows(tmp_path, rows):
    """A Gemm over constant transposed weights needs no probe: int8 per row and block, its input
    quantized per row at call time, the same shapes in and out (the compute-bound encoders)."""
    rng = np.random.default_rng(5)
    param, weights, w = _weight_gemm_toy(tmp_path, rng, rows)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    out_p, out_b = tmp_path / "q.ncnn.param", tmp_path / "q.ncnn.bin"
    receipts = rewrite_graph(param, weights, out_p, out_b, {}, block=128, gemms=True)
    assert [(r["layer"], r["input_dims"]) for r in receipts] == [("fc", "rows")]
    gemm = read_param(out_p).layers[-1]
    assert gemm.type == "Gemm" and gemm.get("18") == "802" and gemm.get("8") == str(N)
    int8_ref = np.stack([_int8_matvec(w["w"], row, 128) for row in x]) + w["b"]
    fp32_ref = x @ w["w"].T + w["b"]
    got = _run_rows(out_p, out_b, x).reshape(rows, N)
    scale = np.abs(fp32_ref).max()
    assert np.abs(got - int8_ref).max() / scale < 1e-5  # ncnn computes exactly this quantization
    assert np.abs(got - fp32_ref).max() / scale > 1e-4  # and it is one
    walked = walk_bin(read_param(out_p), out_b.read_bytes(), str(out_b))
    assert [b.nbytes for b in walked["fc"]] == [N * K, 4 * N, 4 * N * 3]  # int8 B, C, scales [N][3]


def test_gemm_of_another_layout_is_left_alone(tmp_path):
    param, weights, _ = _weight_gemm_toy(tmp_path, np.random.default_rng(6), 4)
    param.write_text(param.read_text().replace("3=1 4=0", "3=1 14=1 4=0"))  # transposed output
    out_p, out_b = tmp_path / "q.ncnn.param", tmp_path / "q.ncnn.bin"
    assert rewrite_graph(param, weights, out_p, out_b, {}, gemms=True) == []
    assert out_b.read_bytes() == weights.read_bytes()


def test_bin_walk_reads_convolution_multihead_attention_and_padding_records(tmp_path):
    """The other weighted layers of graphs that hold weight Gemms (audio and VAE encoders): their
    records are walked (and copied) in ncnn's load order."""
    e, kd = 8, 6
    param = tmp_path / "m.ncnn.param"
    param.write_text("7767517\n4 4\nInput in0 0 1 in0\nPadding pad 1 1 in0 a 6=3\n"
                     "Convolution conv 1 1 a b 0=4 1=3 5=1 6=108\n"
                     f"MultiHeadAttention mha 1 1 b out0 0={e} 1=2 2={e * e} 3={kd} 4={kd}\n")
    sizes = [12, 4 + 4 * 108, 4 * 4, 4 + 4 * e * e, 4 * e, 4 + 4 * e * kd, 4 * e, 4 + 4 * e * kd, 4 * e,
             4 + 4 * e * e, 4 * e]
    walked = walk_bin(read_param(param), b"\0" * sum(sizes), "m.ncnn.bin")
    assert [b.nbytes for b in walked["pad"]] == [12]
    assert [b.nbytes for b in walked["conv"]] == [4 * 108, 16]
    assert [b.nbytes for b in walked["mha"]] == [4 * e * e, 4 * e, 4 * e * kd, 4 * e, 4 * e * kd, 4 * e, 4 * e * e, 4 * e]


def test_only_graphs_whose_spec_sets_int8_rows_get_int8_gemms(tmp_path):
    """Youtu-VL's vision segments and merger (specs with int8_rows) get their Gemms in int8; its
    LLM layers (decode variants of another layout) stay fp32; Qwen3-ASR's audio encoder and
    prefill layers (no int8_rows) keep their fp32 Gemms while its decode projections go int8."""
    from ncnnport.convert.int8_weights import int8_package
    from tests.cpp.packages import tiny_package

    yv = int8_package(tiny_package("youtu-vl"), tmp_path / "yv")
    assert {"vision_seg0", "vision_seg3", "merger"} <= set(yv) and not any(n.startswith("llm_layer") for n in yv)
    assert all(r["input_dims"] == "rows" for r in yv["vision_seg0"])
    gemms = [lay for lay in read_param(tmp_path / "yv" / "ncnn" / "vision_seg0.ncnn.param").layers if lay.type == "Gemm"]
    assert gemms and all(lay.get("18") == "802" for lay in gemms)
    qa = int8_package(tiny_package("qwen3-asr"), tmp_path / "qa")
    assert "decode_layer0" in qa and not any(n.startswith(("audio", "prefill")) for n in qa)
