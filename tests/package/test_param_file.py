import pytest

from ncnnport.contract import ParamPatch
from ncnnport.package.param_file import ParamError, check_loadable, read_param
from ncnnport.convert.patches import apply_patches

PARAM = """7767517
4 4
Input            in0      0 1 in0
Reshape          view_0   1 1 in0 1 0=24 1=13 2=4
pnnx.Expression  expr_0   1 1 1 2 0=add(@0,1)
Reshape          view_1   1 1 2 out0 0=24 1=13 2=4
"""


def write(tmp_path, text=PARAM):
    p = tmp_path / "m.ncnn.param"
    p.write_text(text)
    return p


def test_unloadable_layers_are_named(tmp_path):
    graph = read_param(write(tmp_path))
    with pytest.raises(ParamError, match=r"pnnx.Expression \(expr_0\)"):
        check_loadable(graph, module="decode")


def test_truncated_param_is_rejected(tmp_path):
    text = "\n".join(PARAM.splitlines()[:4]) + "\n"
    with pytest.raises(ParamError, match="announces 4 layers, file has 2"):
        read_param(write(tmp_path, text))
    with pytest.raises(ParamError, match="magic"):
        read_param(write(tmp_path, "hello\n1 1\n"))


def test_patch_rewrites_matching_layers_and_round_trips(tmp_path):
    graph = read_param(write(tmp_path))
    receipts = apply_patches(graph, [ParamPatch("Reshape", {"1": "13"}, {"1": "-1"}, min_matches=2)],
                             module="decode")
    assert [c["layer"] for c in receipts[0]["changed"]] == ["view_0", "view_1"]
    out = tmp_path / "patched.param"
    graph.write(out)
    again = read_param(out)
    assert [layer.get("1") for layer in again.layers if layer.type == "Reshape"] == ["-1", "-1"]


def test_patch_that_matches_nothing_fails(tmp_path):
    graph = read_param(write(tmp_path))
    with pytest.raises(ParamError, match="matched 0 layer"):
        apply_patches(graph, [ParamPatch("Reshape", {"1": "99"}, {"1": "-1"})], module="decode")
    with pytest.raises(ParamError, match="matched 2 layer"):
        apply_patches(graph, [ParamPatch("Reshape", {"1": "13"}, {"1": "-1"}, min_matches=3)], module="decode")
