"""The native half of the ISA replay (``ncnnport isa-replay dump``): every module's parity-size
inputs and torch outputs written as cases that ``parity/isa_replay.replay`` judges on another ISA
path without torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ncnnport.parity.isa_replay import INDEX


def dump_cases(prep: Any, out: Path) -> int:
    """Write every module's parity-size inputs and torch outputs to ``out``; returns the count."""
    from ncnnport.parity.reproducible import deterministic_reference
    from ncnnport.runtime.lazy_modules import LazyTorchModules

    out.mkdir(parents=True, exist_ok=True)
    torch_mods = LazyTorchModules(prep.specs)
    index = []
    with deterministic_reference():
        for spec in prep.specs:
            for i, sizes in enumerate(spec.all_parity_sizes()):
                inputs = spec.example_inputs(sizes, seed=i)  # local parity's own inputs and seeds
                ref = torch_mods[spec.name].run(inputs)
                name = f"{spec.name}.{i}.npz"
                np.savez(out / name, **{f"in{k}": a for k, a in enumerate(inputs)},
                         **{f"ref{k}": r for k, r in enumerate(ref)})
                index.append({"file": name, "module": spec.name, "sizes": dict(sizes),
                              "outputs": [{"name": o.name, "feature_axis": o.feature_axis} for o in spec.outputs]})
            torch_mods.release(spec.name)
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return len(index)
