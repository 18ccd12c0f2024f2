"""Lazy weight sources: seeded per-tensor values and per-tensor safetensors reads."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from ncnnport.lazy_weights import (Init, SafetensorsSource, SeededSource, WeightSourceError, empty_module,
                                   materialize, parameter_shapes, tensor_seed)

SHAPES = {"a.weight": (8, 4), "a.bias": (8,), "b.weight": (3, 8), "norm.weight": (8,)}


def rule(name, shape):
    return Init(1.0, 0.0) if name.startswith("norm") else Init(0.0, 0.5 if name.endswith("weight") else 0.1)


def test_seeded_values_depend_on_seed_name_and_shape_only():
    one = SeededSource(SHAPES, rule, seed=3)
    two = SeededSource(SHAPES, rule, seed=3)
    first = one.get("b.weight")
    assert torch.equal(first, one.get("b.weight"))            # same tensor twice
    _ = two.get("a.weight"), two.get("a.bias")                # other tensors first: no shared stream
    assert torch.equal(first, two.get("b.weight"))
    assert not torch.equal(first, SeededSource(SHAPES, rule, seed=4).get("b.weight"))
    other_shape = SeededSource({**SHAPES, "b.weight": (3, 9)}, rule, seed=3).get("b.weight")
    assert not torch.equal(first[:, :8], other_shape[:, :8])
    assert torch.equal(one.get("norm.weight"), torch.ones(8))
    assert abs(float(SeededSource({"w.weight": (512, 512)}, rule, seed=0).get("w.weight").std()) - 0.5) < 0.01
    assert tensor_seed(3, "b.weight", (3, 8)) != tensor_seed(3, "b.weight", (8, 3))


def test_seeded_aliases_and_errors():
    src = SeededSource({**SHAPES, "head.weight": (3, 8)}, rule, seed=0, aliases={"head.weight": "b.weight"})
    assert torch.equal(src.get("head.weight"), src.get("b.weight"))
    assert "head.weight" in src.names() and src.nbytes("a") == 4 * (32 + 8)
    with pytest.raises(WeightSourceError, match="no tensor"):
        src.get("missing.weight")
    with pytest.raises(WeightSourceError, match="shape"):
        src.get("a.weight", (4, 8))


@pytest.fixture()
def sharded(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}
    save_file({k: tensors[k] for k in ("a.weight", "a.bias")}, str(tmp_path / "s1.safetensors"))
    save_file({k: tensors[k].to(torch.float16) for k in ("b.weight", "norm.weight")}, str(tmp_path / "s2.safetensors"))
    index = {"weight_map": {"a.weight": "s1.safetensors", "a.bias": "s1.safetensors",
                            "b.weight": "s2.safetensors", "norm.weight": "s2.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path, tensors


def test_safetensors_source_reads_only_requested_tensors(sharded, monkeypatch):
    import safetensors

    folder, tensors = sharded
    read: list[str] = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, *a, **k):
            self.f = real_open(*a, **k)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def keys(self):
            return self.f.keys()

        def get_slice(self, name):
            return self.f.get_slice(name)

        def get_tensor(self, name):
            read.append(name)
            return self.f.get_tensor(name)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    src = SafetensorsSource(folder)
    assert read == []                                           # opening reads shapes only
    assert src.shape("b.weight") == (3, 8)
    got = src.tensors("a")
    assert set(got) == {"weight", "bias"} and sorted(read) == ["a.bias", "a.weight"]
    assert torch.equal(got["weight"], tensors["a.weight"])
    b = src.get("b.weight")
    assert b.dtype == torch.float32 and torch.equal(b, tensors["b.weight"].to(torch.float16).float())
    assert sorted(read) == ["a.bias", "a.weight", "b.weight"]


def test_safetensors_source_refuses_pickles_and_missing_shards(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="pickle"):
        SafetensorsSource(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="missing"):
        SafetensorsSource(tmp_path)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 3, bias=False)
        self.norm = nn.LayerNorm(8, elementwise_affine=True, bias=False)
        self.register_buffer("table", torch.arange(5.0), persistent=False)


def test_empty_module_and_materialize_one_submodule():
    skeleton = empty_module(Net)
    assert all(p.device.type == "meta" for p in skeleton.parameters())
    assert torch.equal(skeleton.table, torch.arange(5.0))      # constructor-computed buffer is real
    shapes = parameter_shapes(skeleton)
    assert shapes == SHAPES
    src = SeededSource(shapes, rule, seed=1)
    a = materialize(skeleton.a, src, "a")
    assert torch.equal(a.weight, src.get("a.weight")) and torch.equal(a.bias, src.get("a.bias"))
    assert set(src.reads) == {"a.weight", "a.bias"}
    assert skeleton.a.weight.device.type == "meta"              # the skeleton stays empty
    full = materialize(skeleton, src, "")
    assert torch.equal(full.a.weight, a.weight) and torch.equal(full.norm.weight, torch.ones(8))
    assert torch.equal(full.table, torch.arange(5.0))


def test_row_ranges_read_only_their_rows(tmp_path):
    """get_rows equals the slice of the whole tensor, across seeded row blocks and from a
    safetensors slice, and refuses ranges outside the tensor."""
    from safetensors.torch import save_file

    from ncnnport.lazy_weights import ROW_BLOCK

    big = {"emb.weight": (2 * ROW_BLOCK + 5, 3), "b.weight": (3, 8)}
    src = SeededSource(big, rule, seed=1)
    whole = src.get("emb.weight")
    for a, b in ((0, 7), (ROW_BLOCK - 2, ROW_BLOCK + 3), (2 * ROW_BLOCK, 2 * ROW_BLOCK + 5), (5, 2 * ROW_BLOCK + 1)):
        assert torch.equal(src.get_rows("emb.weight", a, b), whole[a:b]), (a, b)
    assert torch.equal(src.get_rows("b.weight", 1, 3), src.get("b.weight")[1:3])   # one-block tensor
    assert abs(float(whole.std()) - 0.5) < 0.02
    with pytest.raises(WeightSourceError, match="rows 3:2"):
        src.get_rows("b.weight", 3, 2)
    save_file({"emb.weight": whole}, str(tmp_path / "model.safetensors"))
    st = SafetensorsSource(tmp_path)
    assert torch.equal(st.get_rows("emb.weight", ROW_BLOCK - 1, ROW_BLOCK + 2), whole[ROW_BLOCK - 1:ROW_BLOCK + 2])
