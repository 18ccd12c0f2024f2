"""The stage chain of a streamed parity (``parity --stream``): one module of each side resident.

Why: a model too large for its torch reference and its ncnn package in memory together is
compared stage by stage instead, each side handing its activations on. Every model wrote the same
loop around its own stages: run the reference stage on the reference input, feed the ncnn graphs
of that stage the same input (the ``local`` row: the graphs alone) and their own previous output
(the ``propagated`` row: the ncnn chain on its own outputs), release the graphs, record both rows,
carry both outputs to the next stage, peak RSS per phase. A model now declares its stages
(:class:`ChainStage`) and :func:`run_chain` walks them; host steps between stage runs (noise,
Euler step, colour fix) stay the model's own code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.parity.records import stage_record


def _same(x: Any) -> Any:
    return x


@dataclass
class ChainStage:
    """One stage of both chains.

    ``torch(ref_in) -> ref_out`` is the reference stage; ``ncnn(x) -> out`` runs the stage's
    graphs (``graphs``, released when the stage is done) on ``x``: once on ``to_ncnn(ref_in)``
    (local) and once on the ncnn chain's own previous output (propagated). ``compare`` picks the
    array each side's output is judged by; the rows are ``<name>/local`` and ``propagated_as``
    (default ``<name>``)."""

    name: str
    torch: Callable[[Any], Any]
    ncnn: Callable[[Any], Any]
    graphs: Sequence[str]
    tol: Tolerance
    local_tol: Tolerance
    to_ncnn: Callable[[Any], Any] = _same
    compare_ref: Callable[[Any], Any] = _same
    compare_ncnn: Callable[[Any], Any] = _same
    propagated_as: str | None = None
    phase: str | None = None  # the phases' name (default ``name``): ``<phase>_torch``, ``<phase>_ncnn``
    one_phase: bool = False   # measure torch and ncnn of this stage as one phase ``<phase>``


@dataclass
class Chain:
    """Where the chain records and measures: ``fixture`` names the rows, ``extra`` goes into
    every row, ``phases`` is a ``memory.PhaseMemory``, ``runners`` the ncnn side's lifecycle."""

    fixture: str
    phases: Any
    runners: Any
    extra: dict[str, Any]
    records: list[dict[str, Any]]

    def record(self, stage: str, ref: Any, cand: Any, tol: Tolerance, **more: Any) -> dict[str, Any]:
        rec = stage_record(self.fixture, stage, np.asarray(ref), np.asarray(cand), tol, **self.extra, **more)
        self.records.append(rec)
        return rec


def _run_sides(chain: Chain, st: ChainStage, ref: Any, cand: Any) -> tuple[Any, Any, Any]:
    """(reference output, local ncnn output, propagated ncnn output) of one stage, measured."""
    def ncnn_sides() -> tuple[Any, Any]:
        return st.ncnn(st.to_ncnn(ref)), st.ncnn(cand)

    phase = st.phase or st.name
    if st.one_phase:
        return chain.phases.run(phase, lambda: (st.torch(ref), *ncnn_sides()))
    ref_out = chain.phases.run(f"{phase}_torch", lambda: st.torch(ref))
    local, prop = chain.phases.run(f"{phase}_ncnn", ncnn_sides)
    return ref_out, local, prop


def run_chain(chain: Chain, stages: Sequence[ChainStage], ref: Any, cand: Any) -> tuple[Any, Any]:
    """Walk ``stages`` from the reference input ``ref`` and the ncnn chain's input ``cand``;
    each stage's graphs are released before the next stage runs. Returns both final outputs."""
    for st in stages:
        ref_out, local, prop = _run_sides(chain, st, ref, cand)
        for name in st.graphs:
            chain.runners.release(name)
        chain.record(f"{st.name}/local", st.compare_ref(ref_out), st.compare_ncnn(local), st.local_tol)
        chain.record(st.propagated_as or st.name, st.compare_ref(ref_out), st.compare_ncnn(prop), st.tol)
        ref, cand = ref_out, prop
    return ref, cand


def worst(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first lowest-cosine row of ``records`` (stage, cosine, max_abs), or None if empty."""
    if not records:
        return None
    r = min(records, key=lambda r: r["cosine"])
    return {"stage": r["stage"], "cosine": r["cosine"], "max_abs": r["max_abs"]}
