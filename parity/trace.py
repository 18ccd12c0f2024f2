"""First divergence: every module call of the ncnn pipeline compared with the same call of the
torch-wrapper pipeline, both propagated (each on its own inputs) and local (the ncnn module fed
the torch call's exact inputs).

Memory stays bounded: the reference run spills each call's inputs and outputs to a scratch
folder, the ncnn run streams through them computing statistics, and only the ``keep`` worst
calls' tensors are kept (as .npz in the report folder). The first call, in execution order,
whose propagated error breaks its module's gate is the first divergence; the ratio of
propagated to local error per module says whether a module is itself wrong (ratio ~1, local
error high) or inherits error from upstream (ratio >> 1, local error small).

``gate`` says what fails the record. ``"propagated"`` (default): the first propagated call
over its module's propagated gate, or any call whose LOCAL error (the module fed the torch
call's exact inputs) breaks its local gate. ``"local"``: only the latter; the first propagated
exceedance is still named. The two gates differ where the policy states a propagated
amplification apart (``Policy.propagated_module``); a local failure fails under both, since the
module is then wrong on its own inputs whatever its upstream did. A model's
policy picks "local" where a deep stack's propagated fp32 error is measured to outgrow the
per-module gates while the end-to-end outputs stay within the reference's own fp32 noise (the
e2e logits and token gates then judge the accumulated error).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ncnnport.contract import Tolerance
from ncnnport.metrics import compare, judge

PipelineRun = Callable[[Mapping[str, Any]], Any]


def policy_gates(policy: Any, precision: str, names: Sequence[str],
                 propagated: bool = False) -> Callable[[str, str], Tolerance]:
    """``tolerances(module, output)`` for :func:`first_divergence` from a model's policy (None:
    the contract's default gate for every output): the local gates, or with ``propagated`` the
    gates of a module run on the pipeline's own outputs (``Policy.propagated_module``)."""
    default = policy.default(precision) if policy else Tolerance()
    tols: dict[str, dict[str, Tolerance]] = {}
    if policy:
        gates = policy.propagated_module if propagated else policy.module
        tols = {n: gates(n, precision) for n in names}
    return lambda m, o: tols[m].get(o, tols[m]["*"]) if m in tols else default


def trace_gates(policy: Any, precision: str, names: Sequence[str]) -> dict[str, Callable[[str, str], Tolerance]]:
    """Both gate functions of :func:`first_divergence` from a model's policy, as keywords."""
    return {"tolerances": policy_gates(policy, precision, names),
            "propagated_tolerances": policy_gates(policy, precision, names, propagated=True)}


class _SpillingRecorder:
    """Torch-side runner: runs the call and spills its inputs/outputs to disk."""

    def __init__(self, inner: Any, store: Path, log: list[tuple[str, int]]) -> None:
        self.inner, self.store, self.log = inner, store, log
        self.name, self.inputs, self.outputs = inner.name, inner.inputs, inner.outputs
        self.count = 0

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = self.inner.run(arrays)
        np.savez(self.store / f"{self.name}.{self.count}.npz",
                 **{f"i{k}": a for k, a in enumerate(arrays)}, **{f"o{k}": o for k, o in enumerate(out)})
        self.log.append((self.name, self.count))
        self.count += 1
        return out


class _Comparer:
    """ncnn-side runner: runs the call, compares with the spilled reference, streams stats."""

    def __init__(self, inner: Any, store: Path, sink: Callable[..., None]) -> None:
        self.inner, self.store, self.sink = inner, store, sink
        self.name, self.inputs, self.outputs = inner.name, inner.inputs, inner.outputs
        self.count = 0

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = self.inner.run(arrays)
        path = self.store / f"{self.name}.{self.count}.npz"
        if path.is_file():
            with np.load(path) as z:
                ref_in = [z[f"i{k}"] for k in range(len(self.inputs))]
                ref_out = [z[f"o{k}"] for k in range(len(self.outputs))]
            local = self.inner.run(ref_in) if _differs(ref_in, arrays) else out
            self.sink(self.name, self.count, ref_out, out, local)
        self.count += 1
        return out


def _differs(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    return any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, b))


def first_divergence(case: str, run: PipelineRun, torch_modules: Mapping[str, Any],
                     ncnn_modules: Mapping[str, Any], tolerances: Callable[[str, str], Tolerance],
                     keep: int = 3, keep_dir: Path | None = None, gate: str = "propagated",
                     propagated_tolerances: Callable[[str, str], Tolerance] | None = None) -> dict[str, Any]:
    """Run ``run`` on the torch wrappers, then on ncnn, and compare call by call.

    ``run(modules)`` must make the same sequence of calls on both backends (feed forced tokens
    for generation). ``tolerances(module, output)`` gives each output's gate for the local
    check; ``propagated_tolerances`` the gate of its propagated check (default: the same), which
    a policy may derive from a larger amplification (``roundoff_rule.propagated``).
    """
    if gate not in ("propagated", "local"):
        raise ValueError(f"trace gate {gate!r}: use 'propagated' or 'local'")
    scratch = Path(tempfile.mkdtemp(prefix="ncnnport-trace-"))
    try:
        order: list[tuple[str, int]] = []
        run({n: _SpillingRecorder(m, scratch, order) for n, m in torch_modules.items()})
        rank = {key: i for i, key in enumerate(order)}
        calls: list[dict[str, Any]] = []
        worst: list[tuple[float, str, dict[str, np.ndarray]]] = []

        def sink(module: str, index: int, ref: list, prop: list, local: list) -> None:
            for out, r, p, l in zip(ncnn_modules[module].outputs, ref, prop, local):
                name, axis = out.name, out.feature_axis
                tol = tolerances(module, name)
                ps = compare(r, p, what=f"{module}/{name}", feature_axis=axis)
                ls = compare(r, l, what=f"{module}/{name}", feature_axis=axis)
                passed, reason = judge(ps, (propagated_tolerances or tolerances)(module, name))
                local_passed, local_reason = judge(ls, tol)
                rel = ps.max_abs / max(ps.ref_absmax, 1e-30)
                calls.append({"order": rank.get((module, index), -1), "module": module, "call": index,
                              "output": name, "propagated_max_abs": ps.max_abs, "propagated_cosine": ps.cosine,
                              "local_max_abs": ls.max_abs, "local_cosine": ls.cosine,
                              "ratio": ps.max_abs / max(ls.max_abs, 1e-12), "passed": passed, "reason": reason,
                              "local_passed": local_passed, "local_reason": local_reason})
                if keep_dir is not None:
                    worst.append((rel, f"{module}.{index}.{name}", {"reference": r, "ncnn": p, "local": l}))
                    worst.sort(key=lambda w: -w[0])
                    del worst[keep:]

        run({n: _Comparer(m, scratch, sink) for n, m in ncnn_modules.items()})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    calls.sort(key=lambda c: (c["order"], c["output"]))
    failing = [c for c in calls if not c["passed"]]
    first = failing[0] if failing else None
    local_failing = [c for c in calls if not c["local_passed"]]
    first_local = local_failing[0] if local_failing else None
    per_module: dict[str, dict[str, Any]] = {}
    for c in calls:
        m = per_module.setdefault(c["module"], {"module": c["module"], "first_order": c["order"], "calls": set(),
                                                "propagated_max_abs": 0.0, "local_max_abs": 0.0})
        m["calls"].add(c["call"])
        m["propagated_max_abs"] = max(m["propagated_max_abs"], c["propagated_max_abs"])
        m["local_max_abs"] = max(m["local_max_abs"], c["local_max_abs"])
    for m in per_module.values():
        m["calls"] = len(m["calls"])
        m["ratio"] = m["propagated_max_abs"] / max(m["local_max_abs"], 1e-12)
    kept = []
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        for rel, label, tensors in worst:
            path = keep_dir / f"{case}.{label}.npz".replace("/", "_").replace(":", "_")
            np.savez_compressed(path, **tensors)
            kept.append({"label": label, "relative_max_abs": rel, "file": path.name})
    return {
        "fixture": case, "stage": "first_divergence", "kind": "trace", "calls_compared": len(calls),
        "first_divergence": None if first is None else {k: first[k] for k in
                                                       ("module", "call", "output", "order", "reason")},
        "modules": sorted(per_module.values(), key=lambda m: m["first_order"]),
        "first_local_failure": None if first_local is None else {
            k: first_local[k] for k in ("module", "call", "output", "order", "local_reason")},
        "worst_tensors": kept, "gate": gate,
        # a module wrong on the torch call's own inputs fails under either gate; "local" only
        # excuses an inherited (propagated) exceedance
        "passed": first_local is None and (first is None or gate == "local"),
        "reason": _trace_reason(first, first_local, gate),
    }


def _trace_reason(first: dict | None, first_local: dict | None, gate: str) -> str:
    if first_local is not None and (gate == "local" or first is None):
        return (f"{first_local['module']} call {first_local['call']} ({first_local['output']}) breaks its gate "
                f"on the torch call's own inputs: {first_local['local_reason']}")
    if first is None:
        return ""
    found = f"first divergence at {first['module']} call {first['call']} ({first['output']}): {first['reason']}"
    return found if gate == "propagated" else f"{found} (propagated only: every call's local error is within its gate)"
