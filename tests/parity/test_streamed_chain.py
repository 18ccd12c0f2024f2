"""The streamed-parity stage chain (parity/streamed.py): local rows feed the graphs the reference
input, propagated rows the chain's own outputs; each stage's graphs are released before the next
stage runs; phases are measured per side."""

from __future__ import annotations

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.parity.streamed import Chain, ChainStage, run_chain, worst
from ncnnport.runtime.lazy_modules import Runners

TOL = Tolerance(min_cosine=0.999, max_abs_rel=1e-2)


class Phases:
    def __init__(self) -> None:
        self.names: list[str] = []

    def run(self, name, fn):
        self.names.append(name)
        return fn()


def _chain(runners) -> Chain:
    return Chain("fx", Phases(), runners, {"streamed": True}, [])


def _stage(name: str, graph: str, runners) -> ChainStage:
    """Reference doubles; the graph ``graph`` (opened from ``runners``) doubles with its own error."""
    return ChainStage(name, lambda x: 2 * x, lambda x: runners[graph].run(x), [graph], tol=TOL, local_tol=TOL)


class Graph:
    def __init__(self, err: float) -> None:
        self.err = err

    def run(self, x):
        return 2 * x * (1 + self.err)


def test_local_rows_see_the_reference_input_and_propagated_rows_accumulate() -> None:
    errs = {"g0": 1e-3, "g1": 1e-3}
    runners = Runners(errs, lambda n: Graph(errs[n]))
    chain = _chain(runners)
    x = np.linspace(1, 2, 8, dtype=np.float32)
    ref, cand = run_chain(chain, [_stage("s0", "g0", runners), _stage("s1", "g1", runners)], x, x)
    rows = {r["stage"]: r for r in chain.records}
    assert list(rows) == ["s0/local", "s0", "s1/local", "s1"]
    assert np.allclose(ref, 4 * x) and np.allclose(cand, 4 * x * (1 + 1e-3) ** 2)
    # the second stage's local row is one graph's error, its propagated row both graphs' errors
    assert rows["s1/local"]["max_abs"] < rows["s1"]["max_abs"]
    assert rows["s1/local"]["streamed"] is True and rows["s1/local"]["fixture"] == "fx"
    assert chain.phases.names == ["s0_torch", "s0_ncnn", "s1_torch", "s1_ncnn"]


def test_each_stage_releases_its_graphs_before_the_next_opens() -> None:
    runners = Runners({"g0": None, "g1": None}, lambda n: Graph(0.0))
    run_chain(_chain(runners), [_stage("s0", "g0", runners), _stage("s1", "g1", runners)],
              np.ones(4, np.float32), np.ones(4, np.float32))
    assert runners.live == [] and runners.live_peak(lambda n: True) == 1


def test_stage_options_convert_compare_name_and_phase() -> None:
    runners = Runners({"g": None}, lambda n: Graph(0.0))
    chain = _chain(runners)
    st = ChainStage("b", lambda r: (2 * r[0], r[1]), lambda c: (runners["g"].run(c[0]), c[1]), ["g"], tol=TOL,
                    local_tol=TOL, to_ncnn=lambda r: (r[0][None], r[1]), compare_ref=lambda r: r[0],
                    compare_ncnn=lambda c: c[0][0], propagated_as="b/propagated", phase="p", one_phase=True)
    x = np.arange(1, 5, dtype=np.float32)
    run_chain(chain, [st], (x, "t"), (x[None], "t"))
    assert [r["stage"] for r in chain.records] == ["b/local", "b/propagated"]
    assert all(r["max_abs"] == 0 for r in chain.records) and chain.phases.names == ["p"]


def test_worst_is_the_first_lowest_cosine_row() -> None:
    rows = [{"stage": "a", "cosine": 0.9, "max_abs": 1.0}, {"stage": "b", "cosine": 0.8, "max_abs": 2.0},
            {"stage": "c", "cosine": 0.8, "max_abs": 3.0}]
    assert worst(rows) == {"stage": "b", "cosine": 0.8, "max_abs": 2.0} and worst([]) is None
