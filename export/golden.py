"""Golden vectors of one exported graph: its example inputs at both trace sizes and what the
TorchScript trace (checked against eager at export) returns for them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ncnnport.contract import ModuleSpec
from ncnnport.package.golden import GoldenCase, write_golden


def golden_cases(spec: ModuleSpec, torchscript: Path) -> list[GoldenCase]:
    """One case per trace size (seed 0 and 1, as export traces and checks them)."""
    import torch

    module = torch.jit.load(str(torchscript), map_location="cpu")  # our own trace file
    module.eval()
    sizes = [spec.trace_sizes(0)] + ([spec.trace_sizes(1)] if spec.has_second_shape() else [])
    cases = []
    with torch.no_grad():
        for seed, s in enumerate(sizes):
            inputs = spec.example_inputs(s, seed=seed)
            out = module(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            cases.append(GoldenCase(dict(s), inputs, [o.detach().float().numpy() for o in outs]))
    return cases


def write_module_golden(spec: ModuleSpec, torchscript: Path, path: Path) -> None:
    """``golden/<module>.npz`` for ``spec`` from its trace."""
    write_golden(path, golden_cases(spec, torchscript))
