import numpy as np
import pytest

from ncnnport.contract import ModuleSpec, ParamPatch, TensorSpec, parse_axis
from tests.toys import toy_spec


def test_tensor_spec_requires_leading_batch_of_one():
    with pytest.raises(ValueError, match="batch axis of 1"):
        TensorSpec("x", ("seq", 16))
    with pytest.raises(ValueError, match="dtype"):
        TensorSpec("x", (1, 4), "int64")


def test_axis_expressions_resolve():
    assert parse_axis("past+1") == ("past", 1)
    t = TensorSpec("k", (1, 2, "past+1", 8))
    assert t.concrete({"past": 5}) == (1, 2, 6, 8)
    assert t.axis_names() == ["past"]


def test_dynamic_axis_needs_two_different_sizes():
    with pytest.raises(ValueError, match="two different sizes"):
        toy_spec(axes={"seq": (5, 5)})
    with pytest.raises(ValueError, match="no trace sizes"):
        toy_spec(axes={})


def test_single_size_axis_only_with_patches_or_reason():
    with pytest.raises(ValueError, match="one size only"):
        toy_spec(axes={"seq": (5, None)})
    patched = toy_spec(axes={"seq": (5, None)}, patches=[ParamPatch("Reshape", {"1": "5"}, {"1": "-1"})])
    assert not patched.has_second_shape()
    assert patched.all_parity_sizes()[0] == {"seq": 5}


def test_parity_sizes_include_both_trace_sizes_first():
    spec = toy_spec()
    assert spec.all_parity_sizes() == [{"seq": 5}, {"seq": 9}, {"seq": 1}, {"seq": 23}]


def test_example_inputs_are_validated_against_the_spec():
    spec = toy_spec(make_inputs=lambda sizes, rng: [np.zeros((1, sizes["seq"], 16), np.float32),
                                                    np.zeros((1, sizes["seq"], 3), np.float32)])
    with pytest.raises(ValueError, match="input mask: shape"):
        spec.example_inputs({"seq": 4})


def test_spec_json_round_trips_names_and_shapes():
    spec = toy_spec()
    rec = spec.to_json()
    assert rec["inputs"][0] == {"name": "x", "shape": [1, "seq", 16], "dtype": "float32"}
    assert rec["axes"] == {"seq": [5, 9]}
    with pytest.raises(ValueError, match="lowercase"):
        ModuleSpec("Bad-Name", build=lambda: None, inputs=[], outputs=[])
