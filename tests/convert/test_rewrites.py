"""Graph variants: the Gemm -> InnerProduct rewrite on param text, and the variant graph run by
ncnn over the base graph's .bin (same numbers in fp32; fp16 weights really used under
use_fp16_storage)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ncnnport.contract import GraphVariant, ModuleSpec, TensorSpec, Tolerance
from ncnnport.package.param_file import ParamError, read_param
from ncnnport.convert.rewrites import apply_rewrites

PARAM = """7767517
5 5
Input            in0      0 1 in0
Gemm             linear   1 1 in0 1 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=32 9=16
Gemm             biased   1 1 1 2 10=4 2=0 3=1 4=0 5=1 6=1 7=0 8=32 9=32
Gemm             plain_b  1 1 2 3 10=-1 2=0 3=0 4=0 5=1 6=1 7=0 8=32 9=32
Gemm             scaled   1 1 3 out0 0=5.000000e-1 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8=8 9=32
"""


def test_only_exact_linear_gemms_become_innerproduct(tmp_path):
    path = tmp_path / "m.ncnn.param"
    path.write_text(PARAM)
    graph = read_param(path)
    (receipt,) = apply_rewrites(graph, ["gemm_to_innerproduct"], module="toy")
    assert [c["layer"] for c in receipt["changed"]] == ["linear"]
    layer = graph.layers[1]
    assert layer.type == "InnerProduct" and dict(layer.params) == {"0": "32", "1": "0", "2": str(32 * 16)}
    # a bias read from the .bin, W not transposed, or alpha != 1 would change the bytes or the math
    assert [lay.type for lay in graph.layers[2:]] == ["Gemm", "Gemm", "Gemm"]
    graph.write(tmp_path / "v.ncnn.param")
    assert read_param(tmp_path / "v.ncnn.param").layer_types()[1] == "InnerProduct"


def test_a_rewrite_that_changes_nothing_or_is_unknown_is_an_error(tmp_path):
    path = tmp_path / "m.ncnn.param"
    path.write_text(PARAM.replace("3=1 4=0 5=1 6=1 7=0 8=32 9=16", "3=0 4=0 5=1 6=1 7=0 8=32 9=16"))
    with pytest.raises(ParamError, match="toy: rewrite gemm_to_innerproduct found no"):
        apply_rewrites(read_param(path), ["gemm_to_innerproduct"], module="toy")
    with pytest.raises(ParamError, match="unknown graph rewrite 'nope'"):
        apply_rewrites(read_param(path), ["nope"], module="toy")


def test_variant_declarations_are_checked():
    with pytest.raises(ValueError, match="names no rewrite"):
        GraphVariant("decode", ())
    with pytest.raises(ValueError, match="lowercase"):
        GraphVariant("Decode", ("gemm_to_innerproduct",))
    with pytest.raises(ValueError, match="must give every axis"):
        _spec(sizes=({"rows": 1},))


class BiasFreeMLP(torch.nn.Module):
    """Two bias-free Linears on [1, seq, 16]: pnnx makes both constant-B Gemms."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.up = torch.nn.Linear(16, 64, bias=False)
        self.down = torch.nn.Linear(64, 8, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(torch.randn(64, 16, generator=g) * 0.3)
            self.down.weight.copy_(torch.randn(8, 64, generator=g) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


def _spec(sizes=({"seq": 1},)) -> ModuleSpec:
    module = BiasFreeMLP().eval()
    return ModuleSpec(name="mlp", build=lambda: module, inputs=[TensorSpec("x", (1, "seq", 16))],
                      outputs=[TensorSpec("y", (1, "seq", 8))], axes={"seq": (5, 9)},
                      parity_sizes=[{"seq": 1}, {"seq": 23}],
                      variants=[GraphVariant("decode", ("gemm_to_innerproduct",), sizes)])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from ncnnport.convert.pnnx_runner import convert_module
    from ncnnport.export.tracing import export_module

    out = tmp_path_factory.mktemp("variant")
    spec = _spec()
    record = export_module(spec, out / "ts")
    receipt = convert_module(record, out / "ts" / "mlp.pt", out / "ncnn")
    return spec, record, receipt, out / "ncnn"


def test_variant_shares_the_bin_and_computes_the_same(converted):
    from ncnnport.parity.local import variant_parity
    from ncnnport.runtime.options import FP32
    from ncnnport.runtime.session import NcnnModule, NcnnError, TorchModule

    spec, record, receipt, ncnn_dir = converted
    assert sorted(p.name for p in ncnn_dir.iterdir()) == ["mlp.decode.ncnn.param", "mlp.ncnn.bin", "mlp.ncnn.param"]
    (variant,) = receipt["variants"]
    assert len(variant["rewrites"][0]["changed"]) == 2
    base = NcnnModule(ncnn_dir / "mlp.ncnn.param", ncnn_dir / "mlp.ncnn.bin", record)
    assert read_param(base.param).layer_types().count("Gemm") == 2
    decode = base.variant("decode")
    assert decode.name == "mlp.decode" and read_param(decode.param).layer_types().count("InnerProduct") == 2
    rng = np.random.default_rng(0)
    for seq in (1, 7):  # InnerProduct on a 2-D blob computes every row, like the Gemm
        x = rng.standard_normal((1, seq, 16)).astype(np.float32)
        (want,), (got,) = base.run([x]), decode.run([x])
        assert got.shape == want.shape == (1, seq, 8)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # under use_fp16_storage the InnerProduct weights are held in fp16: a small, nonzero change
    x = rng.standard_normal((1, 1, 16)).astype(np.float32)
    half = base.variant("decode", FP32.with_(fp16_storage=True)).run([x])[0]
    err = np.abs(half - base.run([x])[0]).max()
    assert 0 < err < 1e-2 * np.abs(half).max()
    rows = variant_parity(spec, TorchModule(spec.build(), record), base, Tolerance())
    assert {r["name"] for r in rows} == {"mlp.decode"} and {r["case"] for r in rows} == {"seq=1"}
    assert all(r["passed"] for r in rows)
    with pytest.raises(NcnnError, match="mlp: no graph variant 'prefill'"):
        base.variant("prefill")


def test_a_variant_is_opened_once_per_module_and_options(converted):
    """Every caller of the same variant under the same options gets the one module (each
    ``generate``'s decode runners, each size of a bench stage: loaded twice, Youtu-VL real-L4's
    fp16 variants took 2 GB more and a bench ran out of memory); other options, or another
    session of the base graph, open their own."""
    from ncnnport.runtime.options import FP32
    from ncnnport.runtime.session import NcnnModule

    _spec_, record, _receipt, ncnn_dir = converted
    base = NcnnModule(ncnn_dir / "mlp.ncnn.param", ncnn_dir / "mlp.ncnn.bin", record)
    decode = base.variant("decode")
    assert base.variant("decode") is decode and base.variant("decode", base.options) is decode
    half = base.variant("decode", FP32.with_(fp16_storage=True))
    assert half is not decode and half.options.fp16_storage
    assert base.variant("decode", FP32.with_(fp16_storage=True)) is half
    other = NcnnModule(ncnn_dir / "mlp.ncnn.param", ncnn_dir / "mlp.ncnn.bin", record)
    assert other.variant("decode") is not decode


def test_with_variant_refuses_a_variant_no_graph_declares(converted):
    from ncnnport.runtime.session import NcnnModule
    from ncnnport.runtime.variants import with_variant

    _, record, _, ncnn_dir = converted
    base = NcnnModule(ncnn_dir / "mlp.ncnn.param", ncnn_dir / "mlp.ncnn.bin", record)
    swapped = with_variant({"mlp": base, "other": object()}, "decode")
    assert swapped["mlp"].name == "mlp.decode"
    with pytest.raises(KeyError, match="variant 'fast'"):
        with_variant({"mlp": base}, "fast")
