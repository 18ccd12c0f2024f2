"""Local parity: each ncnn module fed exactly the inputs its torch wrapper saw.

Inputs are the spec's example inputs at every parity size (both trace sizes plus extras), so a
length baked by pnnx shows up as a failure at the size it was not traced at.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ncnnport.contract import ModuleSpec, TensorSpec, Tolerance
from ncnnport.metrics import compare, judge


def compare_outputs(module: str, case: str, outputs: Sequence[TensorSpec], reference: Sequence[np.ndarray],
                    candidate: Sequence[np.ndarray], tolerances: Mapping[str, Tolerance],
                    default: Tolerance) -> list[dict[str, Any]]:
    """One record per output, in the summary.json ``modules`` schema."""
    rows = []
    for spec, ref, cand in zip(outputs, reference, candidate):
        name = spec.name
        tol = tolerances.get(name, tolerances.get("*", default))
        stats = compare(ref, cand, what=f"{module}/{name}", feature_axis=spec.feature_axis)
        passed, reason = judge(stats, tol)
        rows.append({"name": module, "output": name, "case": case, **stats.to_json(),
                     "tolerance": tol.to_json(), "passed": passed, "reason": reason})
    return rows


def case_label(sizes: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sizes.items()) or "static"


def local_parity(spec: ModuleSpec, torch_runner: Any, ncnn_runner: Any, default: Tolerance,
                 seed: int = 0, sizes_list: Sequence[Mapping[str, int]] | None = None,
                 label: str | None = None) -> list[dict[str, Any]]:
    """Rows for ``spec``'s graph at every parity size (or ``sizes_list``), named ``label``."""
    rows: list[dict[str, Any]] = []
    for i, sizes in enumerate(spec.all_parity_sizes() if sizes_list is None else sizes_list):
        inputs = spec.example_inputs(sizes, seed=seed + i)
        ref = torch_runner.run(inputs)
        got = ncnn_runner.run(inputs)
        rows += compare_outputs(label or spec.name, case_label(sizes), spec.outputs, ref, got, spec.tolerances, default)
    return rows


def variant_parity(spec: ModuleSpec, torch_runner: Any, ncnn_runner: Any, default: Tolerance,
                   seed: int = 0) -> list[dict[str, Any]]:
    """Local parity of each graph variant (``<module>.<variant>`` rows) against the same torch
    wrapper, at the sizes the variant serves: a rewrite that changed the arithmetic fails here
    under the module's own gate, not in a benchmark."""
    rows: list[dict[str, Any]] = []
    for variant in spec.variants:
        runner = ncnn_runner.variant(variant.name)
        rows += local_parity(spec, torch_runner, runner, default, seed=seed,
                             sizes_list=list(variant.sizes) or None, label=f"{spec.name}.{variant.name}")
        del runner
    return rows


def recorded_parity(module: str, calls: Sequence[tuple[Sequence[np.ndarray], Sequence[np.ndarray]]],
                    ncnn_runner: Any, tolerances: Mapping[str, Tolerance], default: Tolerance,
                    case_prefix: str) -> list[dict[str, Any]]:
    """Local parity on inputs recorded from a real pipeline run (see ``RecordingRunner``)."""
    rows = []
    for i, (inputs, ref) in enumerate(calls):
        got = ncnn_runner.run(inputs)
        rows += compare_outputs(module, f"{case_prefix}#{i}", ncnn_runner.outputs, ref, got, tolerances, default)
    return rows
