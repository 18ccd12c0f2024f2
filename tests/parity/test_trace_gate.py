"""The first-divergence trace's two gates on a two-call toy pipeline: module ``a`` is off by a
little (inside its gate), module ``b`` amplifies its input 1000x and is itself exact."""

from __future__ import annotations

import numpy as np
import pytest

from ncnnport.contract import TensorSpec, Tolerance
from ncnnport.parity.trace import first_divergence


class Fn:
    def __init__(self, name: str, fn) -> None:
        self.name, self.fn = name, fn
        self.inputs = [TensorSpec("x", (1, 8))]
        self.outputs = [TensorSpec("y", (1, 8))]

    def run(self, arrays):
        return [self.fn(arrays[0])]


def pipeline(modules):
    x = np.linspace(1, 2, 8, dtype=np.float64)[None]
    modules["b"].run(modules["a"].run([x]))


def trace(a_error: float, b_error: float, gate: str, propagated_floor: float | None = None):
    torch_side = {"a": Fn("a", lambda x: x + 1), "b": Fn("b", lambda x: 1000 * x)}
    ncnn_side = {"a": Fn("a", lambda x: x + 1 + a_error), "b": Fn("b", lambda x: 1000 * x + b_error)}
    tol = Tolerance(min_cosine=0.0, max_abs_rel=0.0, max_abs_floor=1e-3)
    extra = {}
    if propagated_floor is not None:
        loose = Tolerance(min_cosine=0.0, max_abs_rel=0.0, max_abs_floor=propagated_floor)
        extra["propagated_tolerances"] = lambda m, o: loose
    return first_divergence("toy", pipeline, torch_side, ncnn_side, lambda m, o: tol, gate=gate, **extra)


def test_the_propagated_check_takes_its_own_gate_and_the_local_check_keeps_the_local_one():
    """A policy's propagated amplification: b's inherited 0.5 passes a propagated gate of 1, and
    the local gate still catches a module wrong on its own inputs (0.01 > 1e-3)."""
    inherited = trace(5e-4, 0.0, "propagated", propagated_floor=1.0)
    assert inherited["passed"] and inherited["first_divergence"] is None
    for gate in ("local", "propagated"):  # a module wrong on its own inputs fails under either gate
        wrong = trace(0.0, 0.01, gate, propagated_floor=1.0)
        assert not wrong["passed"] and wrong["first_local_failure"]["module"] == "b", gate
        assert wrong["first_divergence"] is None  # 0.01 is inside the propagated gate
        assert "b call 0 (y) breaks its gate on the torch call's own inputs" in wrong["reason"]


def test_inherited_error_fails_the_propagated_gate_only():
    # a: 5e-4 < 1e-3 everywhere; b propagated: 1000 x 5e-4 = 0.5 > 1e-3, b local: exact
    strict, local = trace(5e-4, 0.0, "propagated"), trace(5e-4, 0.0, "local")
    assert strict["first_divergence"]["module"] == "b" and not strict["passed"]
    assert local["first_divergence"]["module"] == "b" and local["passed"]
    assert local["first_local_failure"] is None and "propagated only" in local["reason"]


def test_a_module_wrong_on_its_own_inputs_fails_both_gates():
    for gate in ("propagated", "local"):
        t = trace(0.0, 0.01, gate)
        assert not t["passed"] and t["first_divergence"]["module"] == "b"
    assert trace(0.0, 0.01, "local")["first_local_failure"]["module"] == "b"
    with pytest.raises(ValueError, match="trace gate"):
        trace(0.0, 0.0, "loose")
